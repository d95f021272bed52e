"""Installed distributions, read from their metadata only (nothing is imported).

Why: doctor and the platform probes need versions and requirements of torch, vLLM, SGLang ...
without paying for (or crashing on) importing them. The search path is injectable so tests can
point at a directory of fake ``*.dist-info`` folders.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.metadata as md
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version

_EXTRA = re.compile(r"extra\s*==\s*['\"]([^'\"]+)['\"]")


def normalize(name: str) -> str:
    """PEP 503 normalised project name (``Torch_NPU`` -> ``torch-npu``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_version(text: str | None) -> Version | None:
    """A packaging Version, or None when absent or unparsable (never raises)."""
    if not text:
        return None
    try:
        return Version(text)
    except InvalidVersion:
        return None


@dataclass(frozen=True)
class Dist:
    """One installed distribution: name, version, its requirements and where it lives."""

    name: str
    version: str
    requires: tuple[str, ...] = ()
    location: str = ""

    def requirements(self, extra: str = "") -> list[Requirement]:
        """Requirements active for ``extra`` ("" = the unconditional ones); bad lines skipped."""
        env = dict(default_environment())
        env["extra"] = extra
        out: list[Requirement] = []
        for line in self.requires:
            try:
                req = Requirement(line)
            except InvalidRequirement:
                continue
            try:
                if req.marker is not None and not req.marker.evaluate(env):
                    continue
            except Exception:  # an odd marker never breaks doctor
                continue
            out.append(req)
        return out

    def extras(self) -> list[str]:
        """Extra names mentioned in the requirement markers (e.g. sglang's ``srt``)."""
        names: list[str] = []
        for line in self.requires:
            for m in _EXTRA.finditer(line):
                if m.group(1) not in names:
                    names.append(m.group(1))
        return names

    def requirement_on(self, other: str, any_extra: bool = False) -> Requirement | None:
        """This distribution's own requirement on ``other`` (e.g. vllm's on torch), if any.

        With ``any_extra`` a requirement behind an extra counts too: sglang pins torch only
        under ``sglang[srt]``, and an installed torch must still match it.
        """
        want = normalize(other)
        for extra in ["", *(self.extras() if any_extra else [])]:
            for req in self.requirements(extra):
                if normalize(req.name) == want:
                    return req
        return None


@dataclass
class DistIndex:
    """Name -> first installed distribution on ``path`` (sys.path order, like importlib)."""

    path: Sequence[str] | None = None
    _by_name: dict[str, Dist] | None = field(default=None, init=False, repr=False)
    _raw: dict[str, md.Distribution] = field(default_factory=dict, init=False, repr=False)

    def _load(self) -> dict[str, Dist]:
        if self._by_name is not None:
            return self._by_name
        found: dict[str, Dist] = {}
        search = list(self.path) if self.path is not None else list(sys.path)
        for dist in md.distributions(path=search):
            try:
                name = dist.metadata["Name"]
            except Exception:
                continue
            if not name:
                continue
            key = normalize(name)
            if key in found:
                continue
            location = ""
            with contextlib.suppress(Exception):
                location = str(dist.locate_file(""))
            found[key] = Dist(
                name=key,
                version=str(dist.version or ""),
                requires=tuple(dist.requires or ()),
                location=location,
            )
            self._raw[key] = dist
        self._by_name = found
        return found

    def get(self, name: str) -> Dist | None:
        """The installed distribution called ``name`` or None."""
        return self._load().get(normalize(name))

    def version(self, name: str) -> str | None:
        """Installed version string of ``name`` or None."""
        dist = self.get(name)
        return dist.version if dist else None

    def installed(self, names: Iterable[str]) -> list[str]:
        """The subset of ``names`` that is installed, in the given order."""
        return [n for n in names if self.get(n) is not None]

    def all(self) -> dict[str, Dist]:
        """Every installed distribution by normalised name."""
        return dict(self._load())

    def entry_points(self, group: str) -> list[tuple[str, str, str]]:
        """``(dist, name, value)`` of every installed entry point in ``group`` (read from metadata).

        Used for ``torch.backends``: torch >= 2.5 imports each of them inside ``import torch``
        (torch/__init__.py ``_import_device_backends``), so one broken plugin breaks torch.
        """
        self._load()
        out = []
        for key, dist in self._raw.items():
            try:
                eps = [ep for ep in dist.entry_points if ep.group == group]
            except Exception:
                continue
            out += [(key, ep.name, ep.value) for ep in eps]
        return out

    def locate(self, name: str, relpath: str) -> Path | None:
        """A file shipped next to a distribution (e.g. ``torch/version.py``), if it exists."""
        self._load()
        dist = self._raw.get(normalize(name))
        if dist is None:
            return None
        try:
            candidate = Path(str(dist.locate_file(relpath)))
        except Exception:
            return None
        return candidate if candidate.is_file() else None


@dataclass(frozen=True)
class TorchBuild:
    """What kind of torch is installed, read from ``torch/version.py`` as text."""

    version: str | None
    flavour: str  # "cpu" | "cuda" | "rocm" | "none" | "unknown"
    cuda: str | None = None
    hip: str | None = None
    source: str = ""

    @property
    def cuda_major(self) -> int | None:
        """Major CUDA version torch was built with (``12.8`` -> 12)."""
        if not self.cuda:
            return None
        try:
            return int(self.cuda.split(".")[0])
        except ValueError:
            return None

    @property
    def base_version(self) -> str | None:
        """Version without the local tag (``2.7.1+cu126`` -> ``2.7.1``)."""
        v = parse_version(self.version)
        return v.public if v else None


def parse_torch_version_py(text: str) -> dict[str, str | None]:
    """Module-level constant assignments of ``torch/version.py`` (``cuda``, ``hip``, ...)."""
    out: dict[str, str | None] = {}
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return out
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            targets, value = [node.target], node.value
        elif isinstance(node, ast.Assign):
            targets, value = [t for t in node.targets if isinstance(t, ast.Name)], node.value
        else:
            continue
        if isinstance(value, ast.Constant) and (value.value is None or isinstance(value.value, str)):
            for t in targets:
                out[t.id] = value.value
    return out


def torch_build(dists: DistIndex) -> TorchBuild:
    """Torch's version and flavour without importing it (falls back to the local version tag)."""
    version = dists.version("torch")
    if version is None:
        return TorchBuild(version=None, flavour="none", source="torch is not installed")
    vfile = dists.locate("torch", "torch/version.py")
    if vfile is None and dists.path is None:
        import importlib.util

        try:
            spec = importlib.util.find_spec("torch")
        except Exception:
            spec = None
        if spec is not None and spec.origin:
            p = Path(spec.origin).parent / "version.py"
            vfile = p if p.is_file() else None
    if vfile is not None:
        try:
            consts = parse_torch_version_py(vfile.read_text(encoding="utf-8", errors="replace"))
        except OSError:
            pass  # fall back to the local version tag below
        else:
            hip, cuda = consts.get("hip"), consts.get("cuda")
            flavour = "rocm" if hip else "cuda" if cuda else "cpu"
            return TorchBuild(version, flavour, cuda=cuda, hip=hip, source=str(vfile))
    local = (parse_version(version).local or "") if parse_version(version) else ""
    if local.startswith("cu"):
        digits = local[2:]
        cuda = f"{digits[:-1]}.{digits[-1]}" if len(digits) >= 2 and digits.isdigit() else None
        return TorchBuild(version, "cuda", cuda=cuda, source=f"local version tag +{local}")
    if local.startswith("rocm"):
        return TorchBuild(version, "rocm", hip=local[4:], source=f"local version tag +{local}")
    if local == "cpu":
        return TorchBuild(version, "cpu", source="local version tag +cpu")
    return TorchBuild(version, "unknown", source="no torch/version.py and no telling local tag")
