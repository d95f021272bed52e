"""The host as the probes see it: a filesystem root, the environment, installed dists, SMI.

Every probe reads the machine through a ``Host`` so tests can hand it a fake sysfs/dev tree
(``root``), a fake environment, a directory of fake dist-info (``path``) and a fake SMI query.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from rlctl.platforms.dists import DistIndex, TorchBuild, torch_build
from rlctl.platforms.smi import run_smi

SmiQuery = Callable[[str], dict[str, Any]]


@dataclass
class Host:
    """Where probes look. ``root`` prefixes absolute paths (``/sys``, ``/dev``, ``/opt/rocm`` ...)."""

    root: Path = Path("/")
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    path: Sequence[str] | None = None  # distribution search path; None = sys.path
    smi: SmiQuery = run_smi
    python: str = field(default_factory=lambda: ".".join(map(str, sys.version_info[:3])))  # the interpreter
    _smi_cache: dict[str, dict[str, Any]] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        self.root = Path(self.root)

    def p(self, abspath: str) -> Path:
        """``/sys/module/amdgpu`` under this host's root."""
        return self.root / abspath.lstrip("/")

    def exists(self, abspath: str) -> bool:
        try:
            return self.p(abspath).exists()
        except OSError:
            return False

    def read(self, abspath: str) -> str | None:
        """Stripped text of a file, or None when missing/unreadable (never raises)."""
        try:
            return self.p(abspath).read_text(encoding="utf-8", errors="replace").strip()
        except (OSError, ValueError):
            return None

    def glob(self, abspath_dir: str, pattern: str) -> list[Path]:
        """Sorted matches of ``pattern`` in a directory under the root (empty on any error)."""
        try:
            return sorted(self.p(abspath_dir).glob(pattern))
        except OSError:
            return []

    @cached_property
    def dists(self) -> DistIndex:
        return DistIndex(self.path)

    @cached_property
    def torch(self) -> TorchBuild:
        return torch_build(self.dists)

    def query_smi(self, vendor: str) -> dict[str, Any]:
        """The vendor's SMI answer, cached per host; any exception becomes ``ok: False``."""
        if vendor not in self._smi_cache:
            try:
                result = self.smi(vendor)
                if not isinstance(result, dict):
                    result = {"ok": False, "error": f"SMI query returned {type(result).__name__}"}
            except Exception as exc:
                result = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            self._smi_cache[vendor] = result
        return self._smi_cache[vendor]

    def installed(self, *names: str) -> bool:
        """True when every distribution in ``names`` is installed."""
        return all(self.dists.get(n) is not None for n in names)
