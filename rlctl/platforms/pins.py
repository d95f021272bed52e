"""Version pins: the ``Pin`` / ``Facts`` data, ``pins.toml`` parsed into it, and :func:`outcome`.

Evaluation is :mod:`rlctl.platforms.pin_checks` (pure data -> a ``Check`` whose status is ``ok`` /
``violated`` / ``n/a`` / ``unknown`` with a reason), so doctor, the trainer's preflight and tests
share one implementation and one verdict type (:class:`rlctl.verdict.Check`).
"""

from __future__ import annotations

import functools
import importlib.resources
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet

from rlctl.errors import UserError
from rlctl.platforms.dists import DistIndex, TorchBuild
from rlctl.verdict import FAIL, PASS, SKIP, WARN, Check, Verdict

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

_REQUIRED: dict[str, tuple[str, ...]] = {
    "version": ("package", "spec"),
    "own-requirement": ("package", "target"),
    "same-base": ("package", "other"),
    "cuda-driver": ("floors",),
    "rocm": ("min",),
    "rocm-arch": ("arch_min",),
    "matrix": ("package", "matrix", "check"),
    "env": ("variable", "value"),
    "env-default": ("variable", "value"),
    "env-unset": ("variable",),
    "env-ignored": ("variable", "package", "file"),
    "wheel-flavour": ("package", "flavour"),
    "forbidden": ("package",),
    "import": ("package", "module"),
}
_COMMON = ("id", "kind", "source", "symptom", "fix")


@dataclass(frozen=True)
class Pin:
    """One pin: what must hold, where the fact comes from, and what breaks otherwise."""

    id: str
    kind: str
    source: str
    symptom: str
    fix: str
    severity: str = "fail"
    platforms: tuple[str, ...] = ()
    params: Mapping[str, Any] = field(default_factory=dict)

    def applies_to(self, platform: str) -> bool:
        return not self.platforms or platform in self.platforms

    @property
    def package(self) -> str | None:
        return self.params.get("package")


# a pin's status -> its verdict before the pin's severity applies (pin_checks.judge)
STATUS_VERDICT: dict[str, Verdict] = {"ok": PASS, "violated": FAIL, "n/a": SKIP, "unknown": WARN}


def outcome(status: str, reason: str, fix: str = "") -> Check:
    """A pin evaluator's answer: ``status`` ok | violated | n/a (does not apply here) | unknown
    (cannot tell), kept in ``details``; ``fix`` is a fix for this host that replaces the pin's
    generic one ("" = the pin's). :func:`rlctl.platforms.pin_checks.evaluate_pin` names it."""
    return Check("", STATUS_VERDICT[status], reason, fix, "pins", {"status": status})


@dataclass
class Facts:
    """What pins are checked against; built by the platform from its host and probe."""

    platform: str
    dists: DistIndex
    torch: TorchBuild
    env: Mapping[str, str]
    details: Mapping[str, Any] = field(default_factory=dict)
    imports: Mapping[str, str] | None = None  # module -> "" (imported) or error; None = not tried
    python: str = field(default_factory=lambda: ".".join(map(str, sys.version_info[:3])))  # the interpreter


def parse_pins(text: str, origin: str = "pins.toml") -> list[Pin]:
    """Parse and validate pin TOML; a malformed pin is a UserError naming the pin and key."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{origin}: not valid TOML: {exc}") from exc
    pins: list[Pin] = []
    seen: set[str] = set()
    matrices = data.get("matrices", {})
    for i, raw in enumerate(data.get("pin", [])):
        where = f"{origin}: pin[{i}]" + (f" ({raw['id']})" if "id" in raw else "")
        for key in _COMMON:
            if not isinstance(raw.get(key), str) or not raw[key]:
                raise UserError(f"{where}: key '{key}' must be a non-empty string")
        kind = raw["kind"]
        if kind not in _REQUIRED:
            raise UserError(f"{where}: kind {kind!r} is not one of {', '.join(sorted(_REQUIRED))}")
        for key in _REQUIRED[kind]:
            if key not in raw:
                raise UserError(f"{where}: kind {kind!r} needs key '{key}'")
        if "spec" in raw:
            try:
                SpecifierSet(raw["spec"])
            except InvalidSpecifier as exc:
                raise UserError(f"{where}: spec {raw['spec']!r} is not a version specifier") from exc
        severity = raw.get("severity", "fail")
        if severity not in ("fail", "warn"):
            raise UserError(f"{where}: severity {severity!r} must be 'fail' or 'warn'")
        if kind == "matrix":
            table = matrices.get(raw["matrix"])
            if not isinstance(table, dict) or not isinstance(table.get("rows"), list):
                raise UserError(
                    f"{where}: matrix {raw['matrix']!r} is not a [matrices.{raw['matrix']}] table"
                )
        for pkg, spec in (raw.get("only_if") or {}).items():
            try:
                SpecifierSet(spec)
            except InvalidSpecifier as exc:
                raise UserError(f"{where}: only_if {pkg} {spec!r} is not a version specifier") from exc
        if raw["id"] in seen:
            raise UserError(f"{where}: duplicate id {raw['id']!r}")
        seen.add(raw["id"])
        params = {k: v for k, v in raw.items() if k not in (*_COMMON, "severity", "platforms")}
        if kind == "matrix":
            params["rows"] = matrices[raw["matrix"]]["rows"]
            params["matrix_source"] = matrices[raw["matrix"]].get("source", "")
        pins.append(
            Pin(
                id=raw["id"],
                kind=kind,
                source=raw["source"],
                symptom=raw["symptom"],
                fix=raw["fix"],
                severity=severity,
                platforms=tuple(raw.get("platforms", ())),
                params=params,
            )
        )
    return pins


@functools.lru_cache(maxsize=16)
def load_pin_file(path: str) -> tuple[Pin, ...]:
    """A vendor's own pins (``Platform.pin_data``): the same TOML as ``pins.toml``, in a file
    beside the vendor's platform module. An unreadable file is a UserError naming it."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise UserError(f"{path}: the platform's pin data cannot be read: {exc.strerror or exc}") from None
    return tuple(parse_pins(text, path))


@functools.lru_cache(maxsize=1)
def load_pins() -> tuple[Pin, ...]:
    """The pins shipped with rlctl (``rlctl/platforms/pins.toml``)."""
    text = importlib.resources.files("rlctl.platforms").joinpath("pins.toml").read_text(encoding="utf-8")
    return tuple(parse_pins(text, "rlctl/platforms/pins.toml"))
