"""Run-directory checkpoints: one lineage per directory, written atomically, rotated, found for resume.

Layout: ``RUN_DIR/checkpoints/step_000100/`` holds ``driver.pt`` (step, data position, driver RNG,
KL controller, training clock, lineage id, world size, roles) plus one sub-directory per role
written by the workers (DCP shards, which any world size can load: DCP reshards on load), and
``manifest.json``: size and SHA-256 of every file, checked before anything is loaded.
Nothing is unpickled beyond data (``engines/safe_checkpoint.py``).

Safety rules:

- A checkpoint directory only appears under its final ``step_*`` name once every part is on disk
  (written under ``.tmp_step_*``, files fsynced, then renamed), and an old one leaves that name
  (renamed to ``.del_step_*``) before anything inside it is deleted. A process killed at any
  point (``kill -9``) therefore leaves every ``step_*`` directory complete and loadable.
- ``checkpoints/`` holds the checkpoints of one *lineage*: a run started fresh and every resume
  that continues from it. The lineage id is in each checkpoint's driver state. Rotation only
  removes checkpoints of the saving run's lineage, oldest step first; ``--resume auto`` refuses
  a directory that holds several lineages (only a hand-made mix can) rather than guess.
- A start that does not continue the directory's latest checkpoint (``--resume never``, or
  ``--resume PATH`` to some other checkpoint) moves the existing ``checkpoints/`` (and
  ``metrics.jsonl``) aside to ``checkpoints.prev-<timestamp>/`` (``metrics.prev-<timestamp>.jsonl``)
  and says so in the log; nothing of an earlier run is ever deleted.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import signal
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlctl.engines import disk_space
from rlctl.engines.safe_checkpoint import safe_torch_load
from rlctl.errors import CheckpointRefused, RunError, UserError
from rlctl.log import get_logger
from rlctl.trainer.state import manifest

log = get_logger("rlctl.checkpoint")

_STEP_DIR = re.compile(r"^step_(\d{6,})$")
DRIVER_FILE = "driver.pt"
# driver-state format; 3: data only (no pickled objects) and a manifest.json; 2 held numpy's RNG
# state as an array; 1 had no lineage, world size or roles
FORMAT = 3
METRICS_FILE = "metrics.jsonl"
ROLE_DIRS = {"policy": "actor", "critic": "critic"}  # the sub-directory each role writes
# Test hook: SIGKILL this process at the named point inside save_checkpoint (see tests/trainer/
# test_checkpoint.py), the only way to prove a kill at that point leaves a loadable checkpoint.
KILL_AT_ENV = "RLCTL_CHECKPOINT_KILL_AT"
KILL_POINTS = ("tmp_created", "roles_written", "driver_written", "old_moved", "renamed", "rotating")


@dataclass(frozen=True)
class Checkpoint:
    step: int
    path: Path
    lineage: str | None  # None: written before lineages were recorded


@dataclass(frozen=True)
class ResumePlan:
    """What a starting run continues from (``path`` None: fresh) and the lineage it writes."""

    path: Path | None
    lineage: str
    moved_aside: Path | None = None


def checkpoint_root(run_dir: Path) -> Path:
    return run_dir / "checkpoints"


def new_lineage() -> str:
    return uuid.uuid4().hex[:16]


def load_driver_state(path: Path) -> dict[str, Any]:
    """The driver state, read as data only (a crafted file is refused, never run)."""
    return safe_torch_load(path / DRIVER_FILE)


def rng_state() -> dict[str, Any]:
    """The driver's torch, numpy and Python RNG states as tensors, numbers and lists only."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "numpy": {"kind": kind, "keys": keys.tolist(), "pos": pos, "has_gauss": has_gauss, "cached": cached},
        "python": random.getstate(),
    }


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore :func:`rng_state` (or a format-2 checkpoint's numpy tuple)."""
    torch.set_rng_state(state["torch"])
    saved = state["numpy"]
    if isinstance(saved, dict):
        saved = (
            saved["kind"],
            np.asarray(saved["keys"], dtype=np.uint32),
            saved["pos"],
            saved["has_gauss"],
            saved["cached"],
        )
    np.random.set_state(saved)
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))


def read_checkpoint(path: Path) -> Checkpoint:
    """The checkpoint at ``path``; UserError (one line) when it is not a loadable one."""
    if not (path / DRIVER_FILE).is_file():
        raise UserError(
            f"--resume {path}: not a checkpoint directory (no {DRIVER_FILE} inside); expected auto, never "
            "or a RUN_DIR/checkpoints/step_* directory"
        )
    if manifest.has_manifest(path):
        manifest.verify(path, only=[DRIVER_FILE])
    try:
        state = load_driver_state(path)
        step = int(state["step"])
    except UserError:
        raise
    except Exception as exc:  # a corrupt or foreign file: name it, no traceback
        raise UserError(
            f"--resume {path}: {DRIVER_FILE} cannot be read ({type(exc).__name__}: {exc})"
        ) from exc
    if not manifest.has_manifest(path) and state.get("format", 1) >= 3:
        raise CheckpointRefused(
            f"checkpoint {path}: no {manifest.MANIFEST_FILE}, which every save of format "
            f"{state['format']} writes (removed or not a complete checkpoint); not loaded"
        )
    return Checkpoint(step, path, state.get("lineage"))


def verify_files(path: Path) -> None:
    """Every file of checkpoint ``path`` as its save wrote it (older checkpoints: a warning)."""
    if manifest.has_manifest(path):
        manifest.verify(path)
    else:
        log.warning(
            f"checkpoint has no {manifest.MANIFEST_FILE} (saved by an older rlctl): its files are not verified",
            path=str(path),
        )


def list_checkpoints(run_dir: Path) -> list[Checkpoint]:
    """Complete checkpoints of ``run_dir`` by step (ties: by name), whatever their lineage.

    A ``step_*`` directory whose driver state does not load is skipped with a warning (only a
    foreign or damaged file can do that: a save never shows a partial directory under that name);
    one that is refused (more than data inside, or files that differ from its manifest) stops the
    listing, since skipping it would silently resume from an older step.
    """
    root = checkpoint_root(run_dir)
    if not root.is_dir():
        return []
    found = []
    for child in sorted(root.iterdir()):
        m = _STEP_DIR.match(child.name)
        if not (m and (child / DRIVER_FILE).is_file()):
            continue
        try:
            found.append(read_checkpoint(child))
        except CheckpointRefused:
            raise
        except UserError as exc:
            log.warning("skipping unreadable checkpoint", path=str(child), error=str(exc))
    return sorted(found, key=lambda c: (c.step, c.path.name))


def lineage_checkpoints(run_dir: Path) -> list[Checkpoint]:
    """The checkpoints ``--resume auto`` chooses from, by step: all of them when they are of one
    lineage (checkpoints from before lineages count as one); several lineages are refused, naming
    each checkpoint's, since the step order across runs says nothing about which one is current.
    """
    found = list_checkpoints(run_dir)
    lineages = {c.lineage for c in found}
    if len(lineages) > 1:
        names = ", ".join(sorted(f"{c.path.name}={c.lineage or 'unrecorded'}" for c in found))
        raise UserError(
            f"--resume auto: {checkpoint_root(run_dir)} holds checkpoints of several runs ({names}); "
            "pass --resume PATH to pick one or --resume never to start fresh"
        )
    return found


def find_resume_point(run_dir: Path, resume: str) -> Path | None:
    """``auto``: the latest checkpoint of the run's lineage, or None; ``never``: None; else the
    checkpoint directory ``resume`` (UserError, one line, when it is not one)."""
    if resume == "never":
        return None
    if resume == "auto":
        found = lineage_checkpoints(run_dir)
        return found[-1].path if found else None
    return read_checkpoint(Path(resume)).path


def prepare_resume(run_dir: Path, resume: str, check: Callable[[Path, dict], None] | None = None) -> ResumePlan:
    """Decide what a starting run continues from, and make ``checkpoints/`` hold only its lineage.

    ``resume`` (auto, never or a checkpoint path) is read here (:func:`find_resume_point`);
    ``check(path, driver_state)`` may refuse it before anything moves. ``checkpoints/`` is kept when
    the run continues its latest checkpoint, else moved aside (never deleted; a ``--resume PATH``
    inside it is followed to its new place)."""
    point = find_resume_point(run_dir, resume)
    lineage = new_lineage()
    if point is not None:
        verify_files(point)
        state = load_driver_state(point)
        if check is not None:
            check(point, state)
        lineage = state.get("lineage") or lineage
    root = checkpoint_root(run_dir)
    latest = _latest_of_lineage(run_dir)
    continues = point is not None and latest is not None and _same(point, latest)
    moved = None
    if not continues and list_checkpoints(run_dir):  # leftovers of a killed save alone: reused
        moved = _move_aside(run_dir)
        if point is not None and _inside(point, root):
            point = moved / point.resolve().relative_to(root.resolve())
    elif resume == "never" and (run_dir / METRICS_FILE).exists():
        _move_metrics_aside(run_dir, _stamp(run_dir))
    return ResumePlan(point, lineage, moved)


def check_carries_over(path: Path, state: dict[str, Any], roles: list[str]) -> None:
    """Refuse (one line) a checkpoint a run with ``roles`` cannot continue: a newer format, or a
    role whose state it lacks. The world size may differ: DCP reshards the role state on load and
    the driver state (one data stream, one driver RNG, one schedule) has nothing per rank."""
    where = f"--resume: checkpoint {path}"
    if state.get("format", 1) > FORMAT:
        raise UserError(f"{where} has format {state['format']}; this rlctl reads up to {FORMAT}")
    saved = state.get("roles") or [role for role, sub in ROLE_DIRS.items() if (path / sub).is_dir()]
    for role in roles:
        if role not in saved:
            raise UserError(
                f"{where} holds no {role} state (saved roles: {', '.join(saved) or 'none'}); "
                "the profile's algorithm must match the run that wrote it"
            )


def save_checkpoint(
    run_dir: Path,
    step: int,
    driver_state: dict[str, Any],
    write_roles: Callable[[Path], None],
    keep: int,
    lineage: str,
) -> Path:
    """Write a checkpoint atomically, then delete all but the newest ``keep`` of ``lineage``.

    ``write_roles(tmp_dir)`` makes the workers write their parts into ``tmp_dir``; the driver
    state (with ``lineage`` and ``format`` added) goes last, every file is fsynced, then the
    directory is renamed into place. Removal failures are logged as warnings naming the path.
    A failed write removes the partial directory (a full disk: DiskFullError, one line).
    """
    root = checkpoint_root(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:06d}"
    tmp = root / f".tmp_step_{step:06d}_{os.getpid()}"
    if tmp.exists():
        _remove(tmp)
    tmp.mkdir()
    _kill_point("tmp_created")
    try:
        write_roles(tmp)
        _kill_point("roles_written")
        with open(tmp / DRIVER_FILE, "wb") as f:  # a Python file: a full disk keeps its errno
            torch.save({**driver_state, "lineage": lineage, "format": FORMAT}, f)
        manifest.write_manifest(tmp)
        disk_space.fsync_tree(tmp)
    except BaseException as exc:  # nothing partial stays behind, whatever stopped the save
        written = disk_space.tree_bytes(tmp)
        _remove(tmp)
        if disk_space.find_disk_full(exc) is None:
            raise
        raise disk_space.checkpoint_disk_full(final, tmp, exc, written) from exc
    _kill_point("driver_written")
    old = root / f".del_{final.name}_{os.getpid()}"
    if final.exists():  # the same step saved again (a resume from an earlier step): old copy out first
        os.replace(final, old)
        _kill_point("old_moved")
    try:
        os.replace(tmp, final)
    except OSError:
        if old.exists() and not final.exists():
            os.replace(old, final)  # the earlier complete copy goes back under its name
        raise
    disk_space.fsync_dir(root)
    _kill_point("renamed")
    rotate(run_dir, lineage, keep, protect=final)
    for stale in [*root.glob(".tmp_step_*"), *root.glob(".del_step_*")]:
        _remove(stale)
    return final


def rotate(run_dir: Path, lineage: str, keep: int, protect: Path | None = None) -> list[Path]:
    """Remove all but the newest ``keep`` checkpoints of ``lineage`` (by step); returns the removed.

    Checkpoints of other lineages and ``protect`` are never touched. Each one is renamed out of
    the ``step_*`` namespace before its files are deleted, so a kill mid-delete cannot leave a
    ``step_*`` directory with missing shards.
    """
    mine = [c for c in list_checkpoints(run_dir) if c.lineage == lineage]
    doomed = mine[: max(0, len(mine) - max(1, keep))]
    removed = []
    for ckpt in doomed:
        if protect is not None and _same(ckpt.path, protect):
            continue
        trash = ckpt.path.with_name(f".del_{ckpt.path.name}_{os.getpid()}")
        try:
            os.replace(ckpt.path, trash)
        except OSError as exc:
            log.warning("could not remove old checkpoint", path=str(ckpt.path), error=str(exc))
            continue
        _kill_point("rotating")
        _remove(trash)
        removed.append(ckpt.path)
    return removed


# -- helpers -------------------------------------------------------------------------------------------
def _latest_of_lineage(run_dir: Path) -> Path | None:
    try:
        found = lineage_checkpoints(run_dir)
    except UserError:  # several lineages: none of them is "the latest"
        return None
    return found[-1].path if found else None


def _same(a: Path, b: Path) -> bool:
    return a.resolve() == b.resolve()


def _inside(path: Path, root: Path) -> bool:
    return path.resolve().is_relative_to(root.resolve())


def _stamp(run_dir: Path) -> str:
    """A timestamp no ``*.prev-*`` entry of ``run_dir`` uses yet."""
    base = time.strftime("%Y%m%d-%H%M%S")
    for n in range(1000):
        stamp = base if n == 0 else f"{base}-{n}"
        taken = (run_dir / f"checkpoints.prev-{stamp}", run_dir / f"metrics.prev-{stamp}.jsonl")
        if not any(p.exists() for p in taken):
            return stamp
    raise RunError(f"{run_dir}: 1000 entries named *.prev-{base}*; remove some")


def _move_aside(run_dir: Path) -> Path:
    stamp = _stamp(run_dir)
    target = run_dir / f"checkpoints.prev-{stamp}"
    try:
        os.replace(checkpoint_root(run_dir), target)
    except OSError as exc:
        raise RunError(f"could not move {checkpoint_root(run_dir)} aside to {target}: {exc}") from exc
    log.warning(
        "a fresh checkpoint lineage starts here; the previous checkpoints were moved aside", path=str(target)
    )
    _move_metrics_aside(run_dir, stamp)
    return target


def _move_metrics_aside(run_dir: Path, stamp: str) -> None:
    metrics = run_dir / METRICS_FILE
    if metrics.exists():
        target = run_dir / f"metrics.prev-{stamp}.jsonl"
        os.replace(metrics, target)
        log.warning("the previous metrics were moved aside", path=str(target))


def _remove(path: Path) -> None:
    """Delete a directory tree, logging (not hiding, not raising) each failure."""

    def report(func: Callable, failed: str, exc: Any) -> None:
        error = exc[1] if isinstance(exc, tuple) else exc  # onerror (3.10, 3.11) passes exc_info
        log.warning("could not delete", path=failed, error=str(error))

    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=report)
    else:
        shutil.rmtree(path, onerror=report)


def _kill_point(name: str) -> None:
    if os.environ.get(KILL_AT_ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)
