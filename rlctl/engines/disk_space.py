"""A full disk during a save, told in one line: the path, the cause, the space needed and free.

torch.distributed.checkpoint (DCP) gathers each rank's failure into a ``CheckpointException``
(a ``BaseException``) whose ``failures`` map rank -> ``(exception, stack summary)``; the OSError
with ``errno.ENOSPC`` is often only the ``__context__`` of a ``RuntimeError`` from torch's zip
writer (``unexpected pos ...``). :func:`find_disk_full` walks all of that (and the text a worker
error carries across processes) to find it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch

from rlctl.errors import DiskFullError, RunError

_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_FULL_TEXT = re.compile(r"No space left on device|Disk quota exceeded|\[Errno (28|122)\]|DiskFullError:")
_BYTES = re.compile(r"needs about [^(]*\((\d+) bytes[,)]")


def _children(exc: BaseException) -> list[BaseException]:
    out = [e for e in (exc.__cause__, exc.__context__) if e is not None]
    failures = getattr(exc, "failures", None)  # DCP's CheckpointException
    if isinstance(failures, dict):
        for value in failures.values():
            inner = value[0] if isinstance(value, tuple) and value else value
            if isinstance(inner, BaseException):
                out.append(inner)
    out.extend(e for e in getattr(exc, "exceptions", ()) if isinstance(e, BaseException))  # groups
    return out


def find_disk_full(exc: BaseException) -> BaseException | None:
    """The exception in ``exc``'s chain that says the disk (or quota) is full, or None.

    An ``OSError`` with ENOSPC/EDQUOT, a :class:`DiskFullError`, or a worker error (whose cause
    crossed a process boundary as text) whose reason or remote traceback says so.
    """
    seen: set[int] = set()
    todo = [exc]
    while todo:
        current = todo.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, DiskFullError):
            return current
        if isinstance(current, OSError) and current.errno in _FULL_ERRNOS:
            return current
        text = f"{getattr(current, 'reason', '')}\n{getattr(current, 'remote_traceback', '')}"
        if text.strip() and _FULL_TEXT.search(text):
            return current
        todo.extend(_children(current))
    return None


def reported_bytes(exc: BaseException) -> int | None:
    """The ``needs about ... (N bytes)`` a worker's :class:`DiskFullError` reported, if any."""
    m = _BYTES.search(f"{getattr(exc, 'reason', '')} {exc}")
    return int(m.group(1)) if m else None


def human(n: int | None) -> str:
    """``n`` bytes for a person (1.5 MB, 12.0 GB)."""
    if n is None:
        return "an unknown amount"
    value = float(n)
    for unit in ("bytes", "KB", "MB", "GB", "TB"):
        if value < 1024 or unit == "TB":
            return f"{int(value)} bytes" if unit == "bytes" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} bytes"


def free_bytes(path: Path) -> int | None:
    """Free bytes on the filesystem holding ``path`` (its nearest existing parent)."""
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return shutil.disk_usage(p).free
    except OSError:
        return None


def tree_bytes(path: Path) -> int:
    """Total size of the regular files under ``path`` (0 when it is gone)."""
    total = 0
    for dirpath, _, names in os.walk(path):
        for name in names:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


def state_bytes(state: Any) -> int:
    """Bytes of the tensors in a (nested) state dict as saved: a DTensor counts its global size."""
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()  # DTensor: the global numel, written once
    if isinstance(state, dict):
        return sum(state_bytes(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(state_bytes(v) for v in state)
    return 0


def _cause_text(cause: BaseException, inside: Path | None = None) -> str:
    if isinstance(cause, OSError):
        name = str(cause.filename or "")
        if inside is not None and name.startswith(f"{inside}{os.sep}"):
            name = name[len(str(inside)) + 1 :]  # the temporary directory is gone: name the part
        where = f" writing {name}" if name else ""
        return f"{(cause.strerror or 'no space left on device').lower()}{where}"
    return "no space left on device"


def disk_full_error(path: Path, cause: BaseException, needed: int | None, basis: str) -> DiskFullError:
    """One line: ``path``, the cause, the space needed (``basis`` says how it was estimated), free."""
    free = free_bytes(path)
    need = f"needs about {human(needed)} ({needed} bytes, {basis})" if needed is not None else basis
    return DiskFullError(
        f"checkpoint {path}: {_cause_text(cause)}; {need}, {human(free)} free there (shutil.disk_usage)"
    )


def save_failure(path: Path, exc: BaseException, needed: int | None, rank: int) -> RunError:
    """The error a failed save of ``path`` on ``rank`` raises: a :class:`DiskFullError` when the
    disk is full, else a RunError naming the path, the rank and the first cause (one line)."""
    cause = find_disk_full(exc)
    if cause is not None:
        return disk_full_error(path, cause, needed, f"this save's state on all ranks, found on rank {rank}")
    first = exc
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict) and failures:
        value = next(iter(failures.values()))
        first = value[0] if isinstance(value, tuple) else value
    reason = str(first).strip().splitlines()[0] if str(first).strip() else ""
    return RunError(f"saving checkpoint {path} on rank {rank} failed: {type(first).__name__}: {reason}")


def checkpoint_disk_full(final: Path, tmp: Path, exc: BaseException, written: int) -> DiskFullError:
    """One line for a save of ``final`` (written in ``tmp``) that filled the disk: who was writing, the space it needs
    (the latest complete checkpoint's size, else what the workers reported, else at least the
    ``written`` bytes before the failure) and the space free now that its partial files are gone."""
    steps = sorted(p for p in final.parent.glob("step_*") if re.fullmatch(r"step_\d{6,}", p.name))
    previous = steps[-1] if steps else None
    reported = reported_bytes(exc)
    if previous is not None:
        needed, basis = tree_bytes(previous), f"the size of {previous.name}"
    elif reported is not None:
        needed, basis = reported, "the state the workers were writing"
    else:
        needed, basis = written, "at least what was written before the disk filled"
    who = ""
    if hasattr(exc, "role") and hasattr(exc, "rank"):  # a WorkerError
        who = f" (role={exc.role} rank={exc.rank} method={getattr(exc, 'method', '?')})"
    what = _cause_text(find_disk_full(exc) or exc, tmp)
    kept = f"; {previous.name} is kept" if previous is not None else ""
    return DiskFullError(
        f"checkpoint {final}: {what}{who}; needs about {human(needed)} ({basis}), "
        f"{human(free_bytes(final.parent))} free on {final.parent}; the partial save was removed{kept}"
    )


def fsync_tree(root: Path) -> None:
    """fsync every file and directory under ``root`` (what a rename must not overtake)."""
    for dirpath, _, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(dirpath))


def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
