"""A checkpoint's manifest: the size and SHA-256 of every file its save wrote.

Written last by the save (before the directory gets its ``step_*`` name) and checked before
anything of the checkpoint is loaded, so a truncated, damaged or swapped file is refused in one
line naming it instead of loading into a silently different run. Checkpoints written before
manifests existed (driver-state format < 3) load with a warning that nothing was verified.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from rlctl.errors import CheckpointRefused

MANIFEST_FILE = "manifest.json"
_VERSION = 1


def file_sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _files(directory: Path) -> list[str]:
    """Every regular file under ``directory`` but the manifest, as sorted POSIX relative paths."""
    found = []
    for dirpath, _, names in os.walk(directory):
        for name in names:
            rel = (Path(dirpath) / name).relative_to(directory).as_posix()
            if rel != MANIFEST_FILE:
                found.append(rel)
    return sorted(found)


def write_manifest(directory: Path) -> Path:
    """Record every file under ``directory``; returns the manifest's path."""
    files = {
        rel: {"bytes": (directory / rel).stat().st_size, "sha256": file_sha256(directory / rel)}
        for rel in _files(directory)
    }
    path = directory / MANIFEST_FILE
    path.write_text(json.dumps({"version": _VERSION, "files": files}, indent=1, sort_keys=True))
    return path


def has_manifest(directory: Path) -> bool:
    return (directory / MANIFEST_FILE).is_file()


def read_manifest(directory: Path) -> dict[str, dict]:
    """The manifest's ``{relative path: {"bytes", "sha256"}}``; CheckpointRefused if unreadable."""
    path = directory / MANIFEST_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        files = data["files"]
        if data.get("version") != _VERSION or not isinstance(files, dict):
            raise ValueError(f"expected version {_VERSION} with a files table")
        for rel, entry in files.items():
            if Path(rel).is_absolute() or ".." in Path(rel).parts:
                raise ValueError(f"entry {rel!r} is outside the checkpoint")
            int(entry["bytes"]), str(entry["sha256"])
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
        raise CheckpointRefused(f"checkpoint {path}: unreadable manifest ({exc}); not loaded") from exc
    return files


def verify(directory: Path, only: list[str] | None = None) -> None:
    """CheckpointRefused naming the first file (of ``only``, or all) that is missing or differs."""
    files = read_manifest(directory)
    for rel in only if only is not None else sorted(files):
        where = f"checkpoint {directory}: {rel}"
        entry = files.get(rel)
        if entry is None:
            raise CheckpointRefused(f"{where} is not in its {MANIFEST_FILE}; not loaded")
        target = directory / rel
        if not target.is_file():
            raise CheckpointRefused(f"{where} is missing (the save wrote it); not loaded")
        size = target.stat().st_size
        if size != int(entry["bytes"]):
            raise CheckpointRefused(
                f"{where} has {size} bytes, the save wrote {entry['bytes']} (truncated or replaced); not loaded"
            )
        if file_sha256(target) != entry["sha256"]:
            raise CheckpointRefused(
                f"{where} differs from what the save wrote (SHA-256 mismatch: damaged or replaced); not loaded"
            )
