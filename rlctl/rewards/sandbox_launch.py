"""Sandbox launcher: builds the OS layers around one snippet, then execs the snippet's interpreter.

Run by rlctl (as its own user, usually root) as ``python -I -S -B sandbox_launch.py CONFIG.json``;
stdlib only, single-threaded, so forking and unsharing here is safe (rlctl itself has threads).

1. ``unshare`` the requested namespaces (pid, mount, network + ipc/uts; a user namespace too when
   not root), then fork: the child is pid 1 of the fresh pid namespace, so when it exits or is
   killed the kernel kills every process the snippet started (setsid and double forks included).
2. The child, still privileged: makes every mount private, builds a new root on a tmpfs holding
   read-only binds of the system directories and the interpreter's prefix (no home, no run
   directory, no /tmp of the host), a fresh /proc, a minimal /dev and a private tmpfs /tmp that is
   the snippet's scratch; moves it onto / and chroots into it.
   ``/etc`` is a minimal one written here (no credentials, no host configuration).
3. Sets the rlimits, drops to the run's unprivileged uid, joins a fresh session keyring, sets
   no_new_privs and a parent-death signal, installs the seccomp filter (built by
   ``sandbox_seccomp.py``) and execs the interpreter on the audit guard and the snippet.

With ``witness``, the run's nonce and its tests are handed to the guard on fds
``WITNESS_FDS[0]`` and ``WITNESS_FDS[2]`` (their files unlinked first: no file of the sandbox
holds them) and the guard writes the nonce back on ``WITNESS_FDS[1]`` only when the tests ran to
their end (see ``sandbox_verdict.py``).

The launcher waits for the child and writes ``status.json`` (wait status, or the setup error) to
the io directory, which the snippet never sees. ``init_pid`` there lets rlctl kill the namespace.
"""

import ctypes
import ctypes.util
import json
import os
import resource
import select
import signal
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_MOVE, MS_REC, MS_PRIVATE = 32, 4096, 8192, 16384, 1 << 18
MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 1024, 2048, 1 << 21
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 1, 38, 22, 2
KEYCTL_JOIN_SESSION_KEYRING = 1
WITNESS_FDS = (100, 101, 102)  # nonce in, witness out, tests in
ETC_COPIED = ("ld.so.cache", "ld.so.conf", "localtime")  # loader and clock files; no credentials
DEVICES = ("null", "zero", "full", "random", "urandom")
SANDBOX_UID = 1000  # the snippet's uid inside a user namespace (non-root rlctl)

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]


def _check(ret, what):
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(src, target, fstype, flags, data=None):
    enc = [None if s is None else os.fsencode(s) for s in (src, target, fstype, data)]
    _check(_libc.mount(enc[0], enc[1], enc[2], flags, enc[3]), f"mount {fstype or src} on {target}")


def _prctl(option, arg):
    _check(_libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0), f"prctl({option})")


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _install_seccomp(program):
    """Load the classic-BPF filter (packed ``struct sock_filter`` records, 8 bytes each)."""
    buf = ctypes.create_string_buffer(program, len(program))
    prog = _SockFprog(len(program) // 8, ctypes.cast(buf, ctypes.c_void_p))
    _check(_libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0), "seccomp")


def _fresh_session_keyring(keyctl_nr):
    """A new, empty session keyring: no key of rlctl's (or of an earlier run) is reachable."""
    if _libc.syscall(keyctl_nr, KEYCTL_JOIN_SESSION_KEYRING, None) < 0 and ctypes.get_errno() != 38:
        raise OSError(ctypes.get_errno(), f"keyctl(JOIN_SESSION_KEYRING): {os.strerror(ctypes.get_errno())}")


def _minimal_etc(etc, uid, gid):
    """An /etc of a few plain files: users root/nobody/sandbox, localhost, the loader's cache."""
    os.makedirs(etc)
    files = {
        "passwd": f"root:x:0:0::/:/sbin/nologin\nsandbox:x:{uid}:{gid}::/tmp:/sbin/nologin\n"
        "nobody:x:65534:65534::/nonexistent:/sbin/nologin\n",
        "group": f"root:x:0:\nsandbox:x:{gid}:\nnogroup:x:65534:\n",
        "hosts": "127.0.0.1 localhost\n::1 localhost\n",
        "nsswitch.conf": "passwd: files\ngroup: files\nhosts: files\n",
    }
    for name, text in files.items():
        with open(os.path.join(etc, name), "w") as f:
            f.write(text)
    for name in ETC_COPIED:
        src = "/etc/" + name
        if os.path.islink(src):
            os.symlink(os.readlink(src), os.path.join(etc, name))
        elif os.path.isfile(src):
            with open(src, "rb") as fin, open(os.path.join(etc, name), "wb") as fout:
                fout.write(fin.read())
    if os.path.isdir("/etc/alternatives"):  # symlinks some system binaries resolve through
        os.makedirs(etc + "/alternatives")
        for entry in os.scandir("/etc/alternatives"):
            if entry.is_symlink():
                os.symlink(os.readlink(entry.path), os.path.join(etc, "alternatives", entry.name))


def _kept_flags(path):
    """Mount flags that must be kept on a remount (the kernel refuses to clear locked ones)."""
    f = os.statvfs(path).f_flag
    kept = MS_NOSUID | MS_NODEV
    for st, ms in ((8, MS_NOEXEC), (1024, MS_NOATIME), (2048, MS_NODIRATIME), (4096, MS_RELATIME)):
        if f & st:
            kept |= ms
    return kept


def _mount_points():
    with open("/proc/self/mountinfo", "rb") as f:
        lines = f.read().decode("utf-8", "surrogateescape").splitlines()
    out = []
    for line in lines:
        mp = line.split(" ")[4]
        out.append(mp.encode().decode("unicode_escape").encode("latin-1").decode("utf-8", "surrogateescape"))
    return out


def _bind_readonly(src, dst):
    os.makedirs(dst, exist_ok=True)
    _mount(src, dst, None, MS_BIND | MS_REC)
    for mp in _mount_points():
        if mp == dst or mp.startswith(dst + "/"):
            _mount(None, mp, None, MS_BIND | MS_REMOUNT | MS_RDONLY | _kept_flags(mp))


def _build_root(cfg, uid, gid):
    """The snippet's whole file system: read-only host system dirs, fresh /proc, tiny /dev, tmpfs /tmp."""
    root = cfg["root"]
    os.makedirs(root, exist_ok=True)
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing done here reaches the host
    _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=4m")
    _minimal_etc(root + "/etc", uid, gid)
    for path in cfg["ro_paths"]:
        if not os.path.lexists(path):
            continue
        inside = root + path
        os.makedirs(os.path.dirname(inside), exist_ok=True)
        if os.path.islink(path):
            os.symlink(os.readlink(path), inside)
        elif os.path.isdir(path) and not os.path.exists(inside):
            _bind_readonly(path, inside)
    os.makedirs(root + "/dev")
    _mount("tmpfs", root + "/dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=0755,size=64k")
    for dev in DEVICES:
        open(f"{root}/dev/{dev}", "w").close()
        _mount(f"/dev/{dev}", f"{root}/dev/{dev}", None, MS_BIND)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                         ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):  # fmt: skip
        os.symlink(target, f"{root}/dev/{name}")
    os.makedirs(root + "/proc")
    _mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    os.makedirs(root + "/tmp")
    opts = f"mode=0700,uid={uid},gid={gid},size={cfg['scratch_mb']}m,nr_inodes=4096"
    _mount("tmpfs", root + "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, opts)
    for name in cfg["files"]:
        with open(os.path.join(cfg["io_dir"], name), "rb") as src, open(f"{root}/tmp/{name}", "wb") as dst:
            dst.write(src.read())
        os.chown(f"{root}/tmp/{name}", uid, gid)
    _mount(None, root + "/dev", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NOEXEC)
    _mount(None, root, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    os.chdir(root)
    _mount(root, "/", None, MS_MOVE)
    os.chroot(".")
    os.chdir("/tmp")


def _set_limits(lim):
    for name, value in lim.items():
        resource.setrlimit(getattr(resource, name), (value, value))


def _child(cfg, alive_r, err_w):
    """pid 1 of the new namespaces (or a plain child): set up, drop privileges, exec. Never returns."""
    try:
        os.setsid()  # its own session: a kill(0, ...) by the snippet reaches nobody outside
        userns = cfg["userns"]
        uid, gid = (SANDBOX_UID, SANDBOX_UID) if userns else (cfg["uid"], cfg["gid"])
        if cfg["mountns"]:
            _build_root(cfg, uid if uid is not None else os.getuid(), gid if gid is not None else os.getgid())
        else:
            os.chdir(cfg["scratch"])
        _set_limits(cfg["rlimits"])
        if uid is not None and not userns:
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
        if cfg["keyctl_nr"] is not None:
            _fresh_session_keyring(cfg["keyctl_nr"])
        os.umask(0o077)
        _prctl(PR_SET_NO_NEW_PRIVS, 1)
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if cfg["seccomp"]:
            _install_seccomp(bytes.fromhex(cfg["seccomp"]))
        if select.select([alive_r], [], [], 0)[0]:  # EOF: the launcher is already gone
            os._exit(111)
        os.execve(cfg["argv"][0], cfg["argv"], cfg["env"])
    except BaseException as exc:  # noqa: BLE001 - any failure ends the child with a message
        os.write(err_w, f"{type(exc).__name__}: {exc}".encode()[:2000])
    os._exit(125)


def _map_user(uid, gid):
    """Inside a new user namespace, appear as SANDBOX_UID (an unprivileged id once exec'd)."""
    with open("/proc/self/setgroups", "w") as f:
        f.write("deny")
    with open("/proc/self/uid_map", "w") as f:
        f.write(f"{SANDBOX_UID} {uid} 1")
    with open("/proc/self/gid_map", "w") as f:
        f.write(f"{SANDBOX_UID} {gid} 1")


def _open_witness_fds(io_dir):
    """The nonce and the tests (their files unlinked once open) and the witness file, on WITNESS_FDS."""
    nonce = os.open(os.path.join(io_dir, "nonce"), os.O_RDONLY)
    os.unlink(os.path.join(io_dir, "nonce"))
    out = os.open(os.path.join(io_dir, "witness"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    tests = os.open(os.path.join(io_dir, "tests.py"), os.O_RDONLY)
    os.unlink(os.path.join(io_dir, "tests.py"))
    for fd, fixed in zip((nonce, out, tests), WITNESS_FDS, strict=True):
        os.dup2(fd, fixed)  # inheritable: the exec'd guard gets them
        os.close(fd)


def main():
    with open(sys.argv[1]) as f:
        cfg = json.load(f)
    status_path = os.path.join(cfg["io_dir"], "status.json")

    def finish(**status):
        with open(status_path + ".part", "w") as f:
            json.dump(status, f)
        os.rename(status_path + ".part", status_path)

    try:
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != cfg["parent_pid"]:
            os._exit(111)
        for cgroup in cfg["cgroups"]:
            with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
        if cfg["witness"]:
            _open_witness_fds(cfg["io_dir"])
        flags = (CLONE_NEWPID if cfg["pidns"] else 0) | (CLONE_NEWNS if cfg["mountns"] else 0)
        flags |= (CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS) if cfg["netns"] else 0
        if cfg["userns"]:
            uid, gid = os.getuid(), os.getgid()
            _check(_libc.unshare(flags | CLONE_NEWUSER), "unshare")
            _map_user(uid, gid)
        elif flags:
            _check(_libc.unshare(flags), "unshare")
    except OSError as exc:
        finish(error=f"{exc}")
        return
    alive_r, alive_w = os.pipe()
    err_r, err_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(alive_w)
        os.close(err_r)
        _child(cfg, alive_r, err_w)
    os.close(alive_r)
    os.close(err_w)
    if cfg["witness"]:
        for fd in WITNESS_FDS:
            os.close(fd)
    with open(os.path.join(cfg["io_dir"], "init_pid"), "w") as f:
        f.write(str(pid))
    err = b""
    while chunk := os.read(err_r, 4096):  # EOF at the child's exec (close-on-exec) or exit
        err += chunk
    _, wait_status = os.waitpid(pid, 0)  # a pid-namespace init is reaped only after all its processes
    finish(error=err.decode("utf-8", "replace") or None, wait_status=wait_status)


if __name__ == "__main__":
    main()
