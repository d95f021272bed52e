"""In-sandbox guard: runs first inside the sandboxed interpreter, then runs the snippet.

Second layer only: the OS layers (pid, mount and network namespaces, an unprivileged uid,
rlimits; see sandbox_launch.py) are what contain a snippet. A ``sys.addaudithook`` hook, which
cannot be removed once installed, refuses: writes outside the scratch directory (the working
directory), socket connect/bind/send and non-IP/unix sockets, starting programs (exec, spawn,
subprocess, os.system, and importing ``_posixsubprocess``, which can exec without an audit
event), ctypes, the gc walks that would find the hook, trace and profile functions (a tracer can
jump past a failing assert) and opening any process's ``/proc/<pid>/mem``.

Relative paths are resolved against the working directory *and* every open directory fd (the
``open`` audit event omits ``dir_fd``, so ``os.open("mem", dir_fd=os.open("/proc/self", ...))``
is judged as if it were relative to each of them): a write must stay in the scratch directory
under every reading.

Witness: with ``--witness NONCE_FD OUT_FD tests.py``, the guard reads the run's nonce into the
hook's closure (reachable only through the interpreter's hook list), runs the snippet and then
the tests in one namespace, and the tests' last statement raises the ``rlctl.witness`` audit
event. The hook writes the nonce to OUT_FD only when that event comes from the tests' own code
object running in the snippet's namespace: exiting early (``os._exit(0)``, ``SystemExit``,
``atexit``), closing stdout, forking or printing a fake marker cannot produce it.

The hook keeps no state a snippet can change: it has no re-entrancy flag (nothing it calls raises
an audit event), every value and function it uses is bound in its closure when it is made (so
rebinding this module's globals, ``os.path`` or builtins, reached through ``sys._getframe()``,
changes nothing), and paths are resolved with the C functions ``posix.lstat``/``readlink``.
Usage::

    python -I -S -B sandbox_guard.py [--witness NONCE_FD OUT_FD tests.py] snippet.py
"""

import posix
import sys

WITNESS_EVENT = "rlctl.witness"
WITNESS_LINE = f"\n__import__('sys').audit({WITNESS_EVENT!r})\n"


def _make_hook(scratch, witness=None):
    """The audit hook; ``witness`` = (nonce fd, out fd, tests code object, namespace) or None."""
    lstat, readlink, getcwd, fspath = posix.lstat, posix.readlink, posix.getcwd, posix.fspath
    listdir, stat, write, getframe = posix.listdir, posix.stat, posix.write, sys._getframe
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
                       "gc.get_referents", "sys.settrace", "sys.setprofile", "sys._setprofileallthreads",
                       "sys._settraceallthreads", "sys.monitoring.register_callback")  # fmt: skip
    denied_modules = frozenset({"_posixsubprocess", "_ctypes"})
    socket_families = frozenset({1, 2, 10})  # AF_UNIX, AF_INET, AF_INET6
    prefix = scratch + "/"
    nonce, out_fd, tests_code, namespace = b"", -1, None, None
    if witness is not None:
        nonce_fd, out_fd, tests_code, namespace = witness
        nonce = posix.read(nonce_fd, 256)
        posix.close(nonce_fd)
        witness = None  # the closure keeps only what it needs

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
        path = fspath(path)
        if is_a(path, bytes_t):
            path = path.decode("utf-8", "surrogateescape")
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
        if event == WITNESS_EVENT:
            caller = getframe(1)
            if nonce and caller.f_code is tests_code and caller.f_globals is namespace:
                write(out_fd, nonce)
            return
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
            if process_memory(path):
                raise denied(f"sandbox: opening a process's memory is not allowed: {path}")
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
    import types

    args = sys.argv[1:]
    witness, tests_code = None, None
    main_module = types.ModuleType("__main__")
    namespace = main_module.__dict__
    if args[0] == "--witness":
        with open(args[3], encoding="utf-8") as f:
            tests_code = compile(f.read() + WITNESS_LINE, args[3], "exec")
        witness = (int(args[1]), int(args[2]), tests_code, namespace)
        args = args[4:]
    snippet = args[0]
    with open(snippet, "rb") as f:
        snippet_code = compile(f.read(), snippet, "exec")
    sys.argv = [snippet]
    sys.addaudithook(_make_hook(posix.getcwd(), witness))  # bound nowhere else: only the interpreter holds it
    del witness, args
    namespace.update(__file__=snippet, __builtins__=__builtins__)
    sys.modules["__main__"] = main_module
    exec(snippet_code, namespace)
    if tests_code is not None:
        exec(tests_code, namespace)


if __name__ == "__main__":
    main()
