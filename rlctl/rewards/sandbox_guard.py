"""In-sandbox guard: runs first inside the sandboxed interpreter, then runs the snippet.

Second layer only: the OS layers (pid, mount and network namespaces, an unprivileged uid,
rlimits; see sandbox_launch.py) are what contain a snippet. A ``sys.addaudithook`` hook, which
cannot be removed once installed, refuses: writes outside the scratch directory (the working
directory), socket connect/bind/send and non-IP/unix sockets, starting programs (exec, spawn,
subprocess, os.system, and importing ``_posixsubprocess``, which can exec without an audit
event), ctypes, the gc walks, trace and profile functions and opening any process's
``/proc/<pid>/mem``.

Relative paths are resolved against the working directory *and* every open directory fd (the
``open`` audit event omits ``dir_fd``, so ``os.open("mem", dir_fd=os.open("/proc/self", ...))``
is judged as if it were relative to each of them): a write must stay in the scratch directory
under every reading.

The hook never runs the snippet's code: audit events hand it the caller's own objects, so it
only ever looks at exact ``str``, ``bytes``, ``int`` and ``None`` values (``type(x) is str``, no
``isinstance``, ``os.fspath``, ``hasattr`` or formatting of anything else) and refuses every
other argument: a path-like object or a ``str`` subclass is denied without being called, so
``pathlib`` paths must be passed as ``str`` to file functions. It keeps no state a snippet can
change: every value and function it uses is bound in its closure when it is made, and paths are
resolved with the C functions ``posix.lstat``/``readlink``.

Test code (``--verdict NONCE_FD OUT_FD TESTS_FD``) is not run here: ``sandbox_verdict.py`` forks
the snippet into a process of its own and runs the tests in this one (see there), so nothing
the verdict depends on is in the snippet's process.
Usage::

    python -I -S -B sandbox_guard.py [--verdict NONCE_FD OUT_FD TESTS_FD] snippet.py
"""

import posix
import sys

VERDICT_SOURCE = "sandbox_verdict.py"  # copied next to this file in the sandbox's scratch


def _make_hook(scratch):
    """The audit hook: refuses what the module docstring lists; looks only at exact builtin types."""
    lstat, readlink, getcwd = posix.lstat, posix.readlink, posix.getcwd
    listdir, stat, kind = posix.listdir, posix.stat, type
    denied = PermissionError
    str_t, bytes_t, int_t, float_t, tuple_t, none_t = str, bytes, int, float, tuple, type(None)
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
                       "gc.get_referents", "sys.settrace", "sys.setprofile", "sys._setprofileallthreads",
                       "sys._settraceallthreads", "sys.monitoring.register_callback")  # fmt: skip
    denied_modules = frozenset({"_posixsubprocess", "_ctypes"})
    socket_families = frozenset({1, 2, 10})  # AF_UNIX, AF_INET, AF_INET6
    prefix = scratch + "/"

    def shown(value):
        """A value for a message: itself only when an exact str or int (formatting runs no code)."""
        return value if kind(value) is str_t or kind(value) is int_t else "(not a str)"

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

    def readings(path):
        """Every absolute path ``path`` may name: itself, or relative to the cwd and each dir fd."""
        if kind(path) is bytes_t:
            path = path.decode("utf-8", "surrogateescape")
        elif kind(path) is not str_t:
            raise TypeError("not an exact str or bytes")
        if path.startswith("/"):
            return [resolve(path)]
        bases = [getcwd()]
        for fd in listdir("/proc/self/fd"):
            try:
                target = readlink("/proc/self/fd/" + fd)
                if target.startswith("/") and stat("/proc/self/fd/" + fd).st_mode & 0o170000 == 0o040000:
                    bases.append(target)
            except OSError:
                continue
        return [resolve(base + "/" + path) for base in bases]

    def inside(path):
        try:
            reals = readings(path)
        except (TypeError, ValueError, OSError):
            return False
        return all(real is not None and (real == scratch or real.startswith(prefix)) for real in reals)

    def process_memory(path):
        """Whether ``path`` may name a process's memory file (``/proc/<pid>[/task/<tid>]/mem``)."""
        try:
            reals = readings(path)
        except (TypeError, ValueError, OSError):
            return True
        for real in reals:
            parts = (real or "/proc/x/mem").split("/")
            if len(parts) in (4, 6) and parts[1] == "proc" and parts[-1] == "mem":
                return True
        return False

    def hook(event, args):
        if kind(event) is not str_t or kind(args) is not tuple_t:
            raise denied("sandbox: malformed audit event")
        if event.startswith(denied_prefixes):
            raise denied(f"sandbox: {event} is not allowed")
        if event == "import":
            if not args or kind(args[0]) is not str_t or args[0] in denied_modules:
                raise denied(f"sandbox: importing {shown(args[0] if args else None)} is not allowed")
        elif event == "open":
            if len(args) != 3:
                raise denied("sandbox: malformed open event")
            path, mode, flags = args
            if path is None or kind(path) is int_t:
                return
            if kind(path) is not str_t and kind(path) is not bytes_t:
                raise denied(f"sandbox: open needs a str or bytes path, not {shown(path)}")
            if kind(flags) is int_t:
                writing = flags & write_flags != 0
            elif kind(mode) is str_t:
                writing = "w" in mode or "a" in mode or "x" in mode or "+" in mode
            else:
                raise denied("sandbox: malformed open event")
            if process_memory(path):
                raise denied(f"sandbox: opening a process's memory is not allowed: {shown(path)}")
            if writing and not inside(path):
                raise denied(f"sandbox: writing outside the scratch directory: {shown(path)}")
        elif event == "socket.__new__":
            if len(args) < 2 or kind(args[1]) is not int_t or args[1] not in socket_families:
                raise denied(f"sandbox: socket family {shown(args[1] if len(args) > 1 else None)} is not allowed")
        elif event == "os.symlink":
            if len(args) < 2 or not inside(args[1]):
                raise denied("sandbox: writing outside the scratch directory (symlink)")
        elif event in path_events:
            for arg in args:
                t = kind(arg)
                if t is str_t or t is bytes_t:
                    if not inside(arg):
                        raise denied(f"sandbox: {event} outside the scratch directory: {shown(arg)}")
                elif t is tuple_t:  # os.utime's times
                    for item in arg:
                        if kind(item) is not int_t and kind(item) is not float_t:
                            raise denied(f"sandbox: {event} with an argument of an unexpected type")
                elif t is not int_t and t is not none_t:
                    raise denied(f"sandbox: {event} needs str or bytes paths, not {shown(arg)}")

    return hook


def run_snippet(code, path):
    """Run the compiled snippet as ``__main__``; its namespace."""
    import types

    module = types.ModuleType("__main__")
    module.__dict__.update(__file__=path, __builtins__=__builtins__)
    sys.modules["__main__"] = module
    exec(code, module.__dict__)
    return module.__dict__


def main():
    args = sys.argv[1:]
    fds = None
    if args[0] == "--verdict":
        fds = (int(args[1]), int(args[2]), int(args[3]))
        args = args[4:]
    snippet = args[0]
    with open(snippet, "rb") as f:
        snippet_code = compile(f.read(), snippet, "exec")
    sys.argv = [snippet]
    scratch = posix.getcwd()

    def install_hook():
        sys.addaudithook(_make_hook(scratch))  # bound nowhere else: only the interpreter holds it

    if fds is None:
        install_hook()
        run_snippet(snippet_code, snippet)
        return
    verdict = {"__name__": "sandbox_verdict"}
    with open(VERDICT_SOURCE, "rb") as f:
        exec(compile(f.read(), VERDICT_SOURCE, "exec"), verdict)
    verdict["run"](fds, snippet_code, snippet, install_hook, run_snippet)


if __name__ == "__main__":
    main()
