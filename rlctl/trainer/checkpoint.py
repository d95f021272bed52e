"""Run-directory checkpoints: written atomically (temp dir + rename), rotated, found for resume.

Layout: ``RUN_DIR/checkpoints/step_000100/`` holds ``driver.pt`` (step, data position, RNG,
KL controller, training clock) plus one sub-directory per role written by the workers. A
checkpoint directory only appears under its final name once every part is on disk, so a crash
mid-save leaves the previous checkpoint as the latest.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from rlctl.errors import UserError

_STEP_DIR = re.compile(r"^step_(\d{6,})$")
DRIVER_FILE = "driver.pt"


def checkpoint_root(run_dir: Path) -> Path:
    return run_dir / "checkpoints"


def list_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """Complete checkpoints, oldest first."""
    root = checkpoint_root(run_dir)
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        m = _STEP_DIR.match(child.name)
        if m and (child / DRIVER_FILE).is_file():
            found.append((int(m.group(1)), child))
    return sorted(found)


def find_resume_point(run_dir: Path, resume: str) -> Path | None:
    """``auto``: latest complete checkpoint or None; ``never``: None; else the given path."""
    if resume == "never":
        return None
    if resume == "auto":
        found = list_checkpoints(run_dir)
        return found[-1][1] if found else None
    path = Path(resume)
    if not (path / DRIVER_FILE).is_file():
        raise UserError(f"--resume {resume}: not a checkpoint directory (no {DRIVER_FILE} inside)")
    return path


def save_checkpoint(
    run_dir: Path,
    step: int,
    driver_state: dict[str, Any],
    write_roles: Callable[[Path], None],
    keep: int,
) -> Path:
    """Write a checkpoint atomically and delete all but the newest ``keep``.

    ``write_roles(tmp_dir)`` makes the workers write their parts into ``tmp_dir``; the driver
    state goes last, then the directory is renamed into place.
    """
    root = checkpoint_root(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:06d}"
    tmp = root / f".tmp_step_{step:06d}_{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    write_roles(tmp)
    torch.save(driver_state, tmp / DRIVER_FILE)
    _fsync_dir(tmp)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(root)
    for _, old in list_checkpoints(run_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    for stale in root.glob(".tmp_step_*"):
        shutil.rmtree(stale, ignore_errors=True)
    return final


def load_driver_state(path: Path) -> dict[str, Any]:
    return torch.load(path / DRIVER_FILE, weights_only=False)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
