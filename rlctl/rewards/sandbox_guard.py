"""In-sandbox guard: runs first inside the sandboxed interpreter, then runs the snippet.

Second layer only: the OS layers (pid, mount and network namespaces, an unprivileged uid,
rlimits; see sandbox_launch.py) are what contain a snippet. A ``sys.addaudithook`` hook, which
cannot be removed once installed, refuses: writes outside the scratch directory (the working
directory), socket connect/bind/send and non-IP/unix sockets, starting programs (exec, spawn,
subprocess, os.system, and importing ``_posixsubprocess``, which can exec without an audit
event), ctypes, and the gc walks that would find the hook.

The hook keeps no state a snippet can change: it has no re-entrancy flag (nothing it calls raises
an audit event), every value and function it uses is bound in its closure when it is made (so
rebinding this module's globals, ``os.path`` or builtins, reached through ``sys._getframe()``,
changes nothing), and paths are resolved with the C functions ``posix.lstat``/``readlink``.
Known limit: ``os.open(..., dir_fd=)`` is not visible to the hook (the audit event omits dir_fd).
Usage::

    python -I -S -B sandbox_guard.py snippet.py
"""

import posix
import sys


def _make_hook(scratch):
    lstat, readlink, getcwd, fspath = posix.lstat, posix.readlink, posix.getcwd, posix.fspath
    is_a, has, truth, denied = isinstance, hasattr, bool, PermissionError
    str_t, bytes_t, int_t = str, bytes, int
    write_flags = posix.O_WRONLY | posix.O_RDWR | posix.O_APPEND | posix.O_CREAT | posix.O_TRUNC
    path_events = frozenset({
        "os.remove", "os.rename", "os.mkdir", "os.rmdir", "os.link", "os.chmod", "os.chown",
        "os.truncate", "os.utime", "os.chflags", "os.setxattr", "os.removexattr", "os.mkfifo", "os.mknod",
        "shutil.copyfile", "shutil.copymode", "shutil.copystat", "shutil.move", "shutil.rmtree",
        "shutil.make_archive", "shutil.chown",
    })  # fmt: skip
    denied_prefixes = ("socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg", "ctypes.",
                       "os.exec", "os.posix_spawn", "os.spawn", "os.system", "os.startfile",
                       "subprocess.Popen", "os.forkpty", "pty.", "gc.get_objects", "gc.get_referrers",
                       "gc.get_referents")  # fmt: skip
    denied_modules = frozenset({"_posixsubprocess", "_ctypes"})
    socket_families = frozenset({1, 2, 10})  # AF_UNIX, AF_INET, AF_INET6
    prefix = scratch + "/"

    def resolve(path):
        """Absolute path with every symlink followed (None: a loop), like os.path.realpath."""
        if not path.startswith("/"):
            path = getcwd() + "/" + path
        todo = path.split("/")[::-1]
        done = []
        hops = 0
        while todo:
            part = todo.pop()
            if part == "" or part == ".":
                continue
            if part == "..":
                if done:
                    done.pop()
                continue
            here = "/" + "/".join(done + [part])
            try:
                mode = lstat(here).st_mode
            except OSError:
                done.append(part)
                continue
            if mode & 0o170000 == 0o120000:
                hops += 1
                if hops > 40:
                    return None
                target = readlink(here)
                if target.startswith("/"):
                    done = []
                todo.extend(target.split("/")[::-1])
                continue
            done.append(part)
        return "/" + "/".join(done)

    def inside(path):
        try:
            path = fspath(path)
            if is_a(path, bytes_t):
                path = path.decode("utf-8", "surrogateescape")
            real = resolve(path)
        except (TypeError, ValueError, OSError):
            return False
        return real is not None and (real == scratch or real.startswith(prefix))

    def hook(event, args):
        if event.startswith(denied_prefixes):
            raise denied(f"sandbox: {event} is not allowed")
        if event == "import":
            if args[0] in denied_modules:
                raise denied(f"sandbox: importing {args[0]} is not allowed")
        elif event == "open":
            path, mode, flags = args
            if path is None or is_a(path, int_t):
                return
            if is_a(flags, int_t):
                writing = truth(flags & write_flags)
            else:
                mode = mode if is_a(mode, str_t) else ""
                writing = "w" in mode or "a" in mode or "x" in mode or "+" in mode
            if writing and not inside(path):
                raise denied(f"sandbox: writing outside the scratch directory: {path}")
        elif event == "socket.__new__":
            if args[1] not in socket_families:
                raise denied(f"sandbox: socket family {args[1]} is not allowed")
        elif event == "os.symlink":
            if not inside(args[1]):
                raise denied(f"sandbox: writing outside the scratch directory: {args[1]}")
        elif event in path_events:
            for arg in args:
                if (is_a(arg, (str_t, bytes_t)) or has(arg, "__fspath__")) and not inside(arg):
                    raise denied(f"sandbox: {event} outside the scratch directory: {arg}")

    return hook


def main():
    import runpy

    snippet = sys.argv[1]
    sys.argv = [snippet]
    sys.addaudithook(_make_hook(posix.getcwd()))  # bound nowhere else: only the interpreter holds it
    runpy.run_path(snippet, run_name="__main__")


if __name__ == "__main__":
    main()
