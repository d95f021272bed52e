"""The ``matrix`` pin kind: the installed package's row of a compatibility matrix (vllm-ascend's
releases: vLLM, Python, CANN, torch, torch_npu), each ``check`` column compared with the host."""

from __future__ import annotations

from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from rlctl.platforms.dists import parse_version
from rlctl.platforms.pins import Facts, Pin, outcome
from rlctl.verdict import Check


def _contains(spec: str, version: str | None) -> bool:
    v = parse_version(version)
    return v is not None and SpecifierSet(spec).contains(v, prereleases=True)


def _release3(version: str | None) -> tuple[int, ...] | None:
    v = parse_version(version)
    return (tuple(v.release) + (0, 0, 0))[:3] if v else None


def normalize_cann(version: str | None) -> str:
    """CANN versions as written by different files: quotes, spaces and case dropped
    (``"8.3.RC1"`` in a quoted ``version=`` line and ``8.3.rc1`` compare equal)."""
    return (version or "").strip().strip("\"'").strip().lower()


def _public(version: str | None) -> Version | None:
    v = parse_version(version)
    return parse_version(v.public) if v is not None else None


def _as_list(value: Any) -> list[str]:
    return [str(x) for x in value] if isinstance(value, (list, tuple)) else [str(value)]


def _matrix_cell_ok(name: str, have: str | None, want: list[str]) -> tuple[bool, str]:
    """Does the installed ``have`` satisfy the row's ``want``? (ok, note)"""
    if have is None:
        return False, ""
    if name == "cann":
        return normalize_cann(have) in {normalize_cann(w) for w in want}, ""
    if name == "python":  # the row's "Python" column is a specifier (">=3.10,<3.13")
        return any(_contains(w, have) for w in want), ""
    if name in ("torch", "torch-npu"):
        # same release is what the row pins; a different .postN build of the same release is noted
        ok = any(_release3(have) == _release3(w) for w in want)
        exact = any(_public(have) == _public(w) for w in want)
        return ok, "" if exact or not ok else f"{name} {have} (row lists {'/'.join(want)})"
    return any(_public(have) == _public(w) for w in want), ""


def matrix_outcome(pin: Pin, f: Facts) -> Check:
    """The installed package's row of a compatibility matrix; ``check`` names the columns."""
    d = f.dists.get(pin.params["package"])
    if d is None:
        return outcome("n/a", f"{pin.params['package']} is not installed")
    mine = _public(d.version)
    row = next((r for r in pin.params["rows"] if _public(str(r.get(d.name))) == mine), None)
    if row is None:
        known = ", ".join(str(r.get(d.name)) for r in pin.params["rows"][:3])
        return outcome(
            "unknown",
            f"{d.name} {d.version} is not in rlctl's copy of the matrix (newest rows: {known}); "
            f"{pin.params.get('matrix_source', '')}".rstrip("; "),
        )
    bad, notes = [], []
    for name in pin.params["check"]:
        want = _as_list(row.get(name, []))
        have = {"cann": f.details.get("cann_version"), "python": f.python}.get(name) or f.dists.version(name)
        ok, note = _matrix_cell_ok(name, have, want)
        if not ok:
            bad.append(f"{name} {have or 'missing'} (wants {' or '.join(want)})")
        elif note:
            notes.append(note)
    if bad:
        return outcome("violated", f"{d.name} {d.version}: {', '.join(bad)}: {pin.symptom}")
    cols = ", ".join(f"{n} {'/'.join(_as_list(row.get(n, [])))}" for n in pin.params["check"])
    extra = f"; note: {'; '.join(notes)}" if notes else ""
    return outcome("ok", f"{d.name} {d.version} row matches ({cols}){extra}")
