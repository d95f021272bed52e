"""A run directory no one else can redirect: whose it is, no symlink followed, one run at a time.

``prepare_run_dir`` creates the run directory (0755) or checks the one there: a real directory
owned by this user, writable by nobody else (group write only for the user's own group, as
umask 002 systems make it), in a parent no one else can swap it out of, with no
symlink where rlctl writes. Another user who pre-creates ``RUN_DIR/profile.toml -> /etc/...`` is
refused before anything is written; rlctl's own files are opened with ``O_NOFOLLOW`` too.

``RunLock`` holds an ``flock`` on ``RUN_DIR/.lock`` for the whole run (the kernel drops it when
the process dies, even by SIGKILL): a second run on the same directory exits 2 naming the
holder's pid and host instead of resuming, truncating and deleting the live run's files.

``atomic_dir`` writes a directory (the HF export) under a temporary name and renames it into
place only when complete, as checkpoints are: a full disk leaves the previous export or none.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import socket
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from rlctl.errors import UserError

LOCK_FILE = ".lock"
# every name rlctl writes at the top of a run directory: none of them may be a symlink
RUN_ENTRIES = (
    LOCK_FILE, "profile.toml", "plan.json", "metrics.jsonl", "samples.jsonl", "error.log", "hf",
    "checkpoints", "base_model",
)  # fmt: skip


def prepare_run_dir(run_dir: Path) -> Path:
    """Create or check ``run_dir`` (see the module docstring); UserError naming what is wrong."""
    run_dir = Path(os.path.abspath(run_dir))
    parent = run_dir.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            os.mkdir(run_dir, 0o755)
        st = os.lstat(run_dir)
        pst = os.stat(parent)
    except OSError as exc:
        raise UserError(f"{run_dir}: cannot create the run directory: {exc.strerror}") from None
    me = os.geteuid()
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise UserError(f"{run_dir}: the run directory is not a directory (a symlink or a file); expected a directory")
    if st.st_uid != me:
        raise UserError(
            f"{run_dir}: the run directory is owned by uid {st.st_uid}, not by this user (uid {me}); "
            "expected a directory of your own (choose another run.name or output_dir)"
        )
    if st.st_mode & 0o002 or (st.st_mode & 0o020 and not _private_group(st.st_gid)):
        raise UserError(
            f"{run_dir}: the run directory is writable by group or others (mode {stat.S_IMODE(st.st_mode):o}); "
            f"expected only its owner to write (chmod go-w {run_dir})"
        )
    if pst.st_mode & 0o022 and not pst.st_mode & stat.S_ISVTX and pst.st_uid != me:
        raise UserError(
            f"{parent}: others may write to the directory holding the run directory and it has no sticky bit "
            "(they could swap the run directory); expected a directory of your own or a sticky one like /tmp"
        )
    for name in RUN_ENTRIES:
        entry = run_dir / name
        try:
            est = os.lstat(entry)
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(est.st_mode):
            raise UserError(f"{entry}: a symlink in the run directory; expected none (rlctl follows no symlink there)")
        if est.st_uid != me or est.st_mode & 0o002:
            raise UserError(
                f"{entry}: owned by uid {est.st_uid} (mode {stat.S_IMODE(est.st_mode):o}) in the run directory; "
                "expected this user's own, writable by no one else"
            )
    return run_dir


def _private_group(gid: int) -> bool:
    """Whether ``gid`` is this user's own group (a umask-002 system's per-user group): no one else in it."""
    import grp
    import pwd

    if gid != os.getegid():
        return False
    try:
        me = pwd.getpwuid(os.geteuid()).pw_name
        members = set(grp.getgrgid(gid).gr_mem) - {me}
        others = [p.pw_name for p in pwd.getpwall() if p.pw_gid == gid and p.pw_name != me]
    except KeyError:
        return False
    return not members and not others


def open_nofollow(path: Path, mode: str = "w", errors: str = "strict") -> IO[str]:
    """``open(path, mode)`` for UTF-8 text ("w" or "a") that refuses a symlink at ``path`` (ELOOP)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    flags |= os.O_APPEND if mode == "a" else os.O_TRUNC
    fd = os.open(path, flags, 0o644)
    return os.fdopen(fd, mode, encoding="utf-8", errors=errors)


def write_text_nofollow(path: Path, text: str) -> None:
    with open_nofollow(path) as fh:
        fh.write(text)


class RunLock:
    """An exclusive ``flock`` on ``RUN_DIR/.lock``; UserError naming the holder when taken."""

    def __init__(self, run_dir: Path) -> None:
        path = Path(run_dir) / LOCK_FILE
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode("utf-8", "replace").strip() or "another process"
            os.close(fd)
            raise UserError(
                f"{run_dir}: the run directory is in use by {holder}; wait for that run to end "
                "or choose another run.name"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on host {socket.gethostname()}\n".encode(), 0)
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the last descriptor drops the flock
            self._fd = None

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


@contextlib.contextmanager
def claimed_run_dir(run_dir: Path) -> Iterator[Path]:
    """The run directory, checked (:func:`prepare_run_dir`) and locked (:class:`RunLock`) for the
    body. A directory this call created is removed again when the body fails before writing
    anything into it (a bad ``--resume PATH`` leaves nothing behind)."""
    created = not os.path.lexists(os.path.abspath(run_dir))
    run_dir = prepare_run_dir(run_dir)
    try:
        with RunLock(run_dir):
            yield run_dir
    except BaseException:
        if created and [p.name for p in run_dir.iterdir()] == [LOCK_FILE]:
            (run_dir / LOCK_FILE).unlink()
            run_dir.rmdir()
        raise


@contextlib.contextmanager
def atomic_dir(final: Path) -> Iterator[Path]:
    """Yield a temporary sibling of ``final`` to fill; on success it replaces ``final``, else it is removed."""
    final = Path(final)
    tmp = final.with_name(f".tmp_{final.name}_{os.getpid()}")
    old = final.with_name(f".old_{final.name}_{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if final.is_symlink() or final.is_file():
        final.unlink()
    if final.exists():
        os.rename(final, old)
    os.rename(tmp, final)
    shutil.rmtree(old, ignore_errors=True)
