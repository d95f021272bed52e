"""In-sandbox guard: runs first inside the sandboxed interpreter, then runs the snippet.

Second layer of the sandbox (the first is the OS: unprivileged user, rlimits, network namespace,
pids cgroup). A ``sys.addaudithook`` hook, which cannot be removed once installed, refuses:
writes outside the scratch directory (the working directory), any socket connect/bind/send,
starting programs (exec, spawn, subprocess, os.system, and importing ``_posixsubprocess``,
which can exec without an audit event) and ctypes. Usage::

    python -I -S -B sandbox_guard.py snippet.py
"""

import os
import runpy
import sys
import threading

_SCRATCH = os.path.realpath(os.getcwd())
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
_PATH_EVENTS = {
    "os.remove", "os.rename", "os.mkdir", "os.rmdir", "os.link", "os.chmod", "os.chown",
    "os.truncate", "os.utime", "os.chflags", "os.setxattr", "os.removexattr", "os.mkfifo", "os.mknod",
    "shutil.copyfile", "shutil.copymode", "shutil.copystat", "shutil.move", "shutil.rmtree",
    "shutil.make_archive", "shutil.chown",
}  # fmt: skip
_DENIED_PREFIXES = ("socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg", "ctypes.",
                    "os.exec", "os.posix_spawn", "os.spawn", "os.system", "os.startfile", "subprocess.Popen",
                    "os.forkpty", "pty.")  # fmt: skip
_DENIED_MODULES = {"_posixsubprocess", "_ctypes"}  # exec without an audit event; raw memory/calls
_local = threading.local()  # per-thread re-entrancy flag: a shared one would let threads race past


def _inside(path):
    try:
        real = os.path.realpath(os.fsdecode(path))
    except (TypeError, ValueError):
        return False
    return real == _SCRATCH or real.startswith(_SCRATCH + os.sep)


def _hook(event, args):
    if getattr(_local, "busy", False):
        return
    _local.busy = True
    try:
        if event.startswith(_DENIED_PREFIXES):
            raise PermissionError(f"sandbox: {event} is not allowed")
        if event == "import" and args[0] in _DENIED_MODULES:
            raise PermissionError(f"sandbox: importing {args[0]} is not allowed")
        if event == "open":
            path, mode, flags = args
            if path is None or isinstance(path, int):
                return
            writing = (
                bool(flags & _WRITE_FLAGS)
                if isinstance(flags, int)
                else any(c in (mode or "") for c in "wax+")
            )
            if writing and not _inside(path):
                raise PermissionError(f"sandbox: writing outside the scratch directory: {path}")
        elif event == "os.symlink":
            if not _inside(args[1]):
                raise PermissionError(f"sandbox: writing outside the scratch directory: {args[1]}")
        elif event in _PATH_EVENTS:
            for arg in args:
                if isinstance(arg, (str, bytes, os.PathLike)) and not _inside(arg):
                    raise PermissionError(f"sandbox: {event} outside the scratch directory: {arg}")
    finally:
        _local.busy = False


def main():
    snippet = sys.argv[1]
    sys.argv = [snippet]
    sys.addaudithook(_hook)
    runpy.run_path(snippet, run_name="__main__")


if __name__ == "__main__":
    main()
