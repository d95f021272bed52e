"""Run an untrusted Python snippet in a subprocess with time, memory, process and network limits.

Layers, each applied when this machine allows it (``sandbox_plan()`` says which):
- time: wall-clock timeout (the process group is killed) and RLIMIT_CPU;
- memory: RLIMIT_AS; output and file size: RLIMIT_FSIZE (stdout/stderr go to size-limited files);
- processes: a pids cgroup per run when the cgroup tree is writable, and RLIMIT_NPROC, which binds
  only a non-root user; so when rlctl runs as root the snippet runs as an unprivileged uid of its
  own (setgid to ``nobody``'s group, setuid to a per-run uid from ``UID_POOL``);
- network: a fresh network namespace (unshare(CLONE_NEWNET); as non-root inside a new user
  namespace); the in-process guard also refuses socket connect/bind/send;
- files: cwd is a fresh scratch directory (also HOME and TMPDIR); the guard refuses writes
  outside it, and the unprivileged user cannot write root's files anyway;
- environment: a clean one (PATH, HOME, TMPDIR, LANG only); ``python -I -S -B``.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import itertools
import os
import pwd
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from rlctl.log import get_logger

CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
GUARD_SOURCE = Path(__file__).with_name("sandbox_guard.py")
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


@dataclass(frozen=True)
class SandboxLimits:
    """Limits of one sandboxed run."""

    timeout_s: float = 5.0
    memory_mb: int = 512
    max_processes: int = 32
    max_output_bytes: int = 1 << 16
    max_file_mb: int = 16
    user: str = "nobody"  # whose group the snippet gets when rlctl runs as root (see SandboxPlan)
    guard: bool = True  # also run the in-process audit-hook guard (off only to test the OS layer)


@dataclass
class SandboxResult:
    """What a run did; ``ok`` means it exited 0 within the limits."""

    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool
    error: str | None = None
    uid: int | None = None  # the uid the snippet ran as (None: rlctl's own)

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out and self.error is None


@dataclass(frozen=True)
class SandboxPlan:
    """Which protections this machine allows; probed once per process.

    As root, each run gets its own unprivileged uid from ``UID_POOL`` (ids with no passwd entry),
    so RLIMIT_NPROC counts only that run's processes: a fork bomb's zombies, or a concurrent run,
    cannot use up another run's allowance as they would under one shared ``nobody``.
    """

    python: str | None
    uid: int | None  # first uid of the pool to switch to (None: stay, i.e. not root)
    gid: int | None
    netns: bool
    cgroup_base: str | None  # directory under which per-run pids cgroups are made
    uid_pool: bool = True  # per-run uids from UID_POOL; False: always ``uid`` (containers with few uids)

    @property
    def process_limit(self) -> bool:
        """Whether a fork bomb meets a limit: a pids cgroup, or RLIMIT_NPROC on a non-root user."""
        return self.cgroup_base is not None or self.uid is not None or os.geteuid() != 0


UID_POOL = range(61000, 65000)
_run_counter = itertools.count()


def _run_uid(plan: SandboxPlan) -> int | None:
    """A uid for one run: cycles through the pool, skipping ids that name real users."""
    if plan.uid is None or not plan.uid_pool:
        return plan.uid
    taken = _passwd_uids()
    for _ in range(len(UID_POOL)):
        uid = UID_POOL[(next(_run_counter) * 7 + os.getpid()) % len(UID_POOL)]
        if uid not in taken:
            return uid
    return plan.uid


@functools.lru_cache(maxsize=1)
def _passwd_uids() -> frozenset[int]:
    return frozenset(p.pw_uid for p in pwd.getpwall())


def _unshare(flags: int) -> None:
    if _libc.unshare(flags) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"unshare: {os.strerror(err)}")


def _preexec(plan: SandboxPlan, uid: int | None, limits: SandboxLimits, cgroup: str | None) -> None:
    """Runs in the child between fork and exec: cgroup, namespaces, rlimits, then drop privileges."""
    if cgroup is not None:
        with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
    if plan.netns:
        _unshare(CLONE_NEWNET if os.geteuid() == 0 else CLONE_NEWUSER | CLONE_NEWNET)
    cpu = int(limits.timeout_s) + 1
    mem = limits.memory_mb * 1024 * 1024
    fsize = max(limits.max_file_mb * 1024 * 1024, limits.max_output_bytes)
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    resource.setrlimit(resource.RLIMIT_NPROC, (limits.max_processes, limits.max_processes))
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if uid is not None and plan.gid is not None:
        os.setgroups([])
        os.setgid(plan.gid)
        os.setuid(uid)
    os.umask(0o077)


def _probe_cgroup() -> str | None:
    """A directory where a per-run pids cgroup can be made and limited, or None."""
    for base in ("/sys/fs/cgroup/pids", "/sys/fs/cgroup"):
        probe = os.path.join(base, f"rlctl-probe-{os.getpid()}-{uuid.uuid4().hex[:6]}")
        try:
            os.mkdir(probe)
        except OSError:
            continue
        try:
            with open(os.path.join(probe, "pids.max"), "w") as f:
                f.write("8")
            return base
        except OSError:
            continue
        finally:
            with contextlib.suppress(OSError):
                os.rmdir(probe)
    return None


def sandbox_plan(user: str = "nobody") -> SandboxPlan:
    """Probe what this machine allows and find an interpreter the sandbox user can run (cached)."""
    return _probe_plan(user)


@functools.cache
def _probe_plan(user: str) -> SandboxPlan:
    uid = gid = None
    if os.geteuid() == 0:
        try:
            pw = pwd.getpwnam(user)
            uid, gid = pw.pw_uid, pw.pw_gid
        except KeyError:
            uid = gid = 65534
    cgroup_base = _probe_cgroup() if os.geteuid() == 0 else None
    candidates = [sys.executable, getattr(sys, "_base_executable", None), "/usr/bin/python3"]
    candidates += [shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")]
    log = get_logger("rlctl.sandbox")
    combos = [
        (netns, pool) for netns in (True, False) for pool in ((True, False) if uid is not None else (False,))
    ]
    for netns, pool in combos:
        for exe in dict.fromkeys(c for c in candidates if c):
            plan = SandboxPlan(exe, uid, gid, netns, cgroup_base, uid_pool=pool)
            res = _run(plan, "import sys; print(sys.version_info[0])", "", SandboxLimits(timeout_s=10))
            if res.ok and res.stdout.strip() == "3":
                log.debug("sandbox plan", python=exe, uid=uid, netns=netns, cgroup=cgroup_base)
                return plan
    log.warning("sandbox: no interpreter runs under the sandbox's limits; code rewards will score 0")
    return SandboxPlan(None, uid, gid, False, cgroup_base)


def _kill_cgroup(cgroup: str) -> None:
    """Kill every process left in a run's cgroup, then remove it (best effort, bounded)."""
    for _ in range(100):
        try:
            with open(os.path.join(cgroup, "cgroup.procs")) as f:
                pids = [int(p) for p in f.read().split()]
        except OSError:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        try:
            os.rmdir(cgroup)
            return
        except OSError:
            time.sleep(0.02)
    get_logger("rlctl.sandbox").warning("sandbox cgroup not removed", cgroup=cgroup)


def _read_head(path: Path, limit: int) -> str:
    with path.open("rb") as f:
        return f.read(limit).decode("utf-8", errors="replace")


def _run(plan: SandboxPlan, code: str, stdin: str, limits: SandboxLimits) -> SandboxResult:
    if plan.python is None:
        return SandboxResult(None, "", "", False, error="no sandbox interpreter available")
    scratch = Path(tempfile.mkdtemp(prefix="rlctl-sbx-"))
    io_dir = Path(tempfile.mkdtemp(prefix="rlctl-sbx-io-"))  # root's; the snippet cannot reach it
    cgroup = None
    uid = _run_uid(plan)
    try:
        (scratch / "snippet.py").write_text(code, encoding="utf-8")
        shutil.copyfile(GUARD_SOURCE, scratch / "sandbox_guard.py")
        (io_dir / "stdin").write_text(stdin, encoding="utf-8")
        if uid is not None:
            for p in (scratch, scratch / "snippet.py", scratch / "sandbox_guard.py"):
                os.chown(p, uid, plan.gid)
        os.chmod(scratch, 0o700)
        if plan.cgroup_base is not None:
            cgroup = os.path.join(plan.cgroup_base, f"rlctl-sbx-{uuid.uuid4().hex}")
            os.mkdir(cgroup)
            with open(os.path.join(cgroup, "pids.max"), "w") as f:
                f.write(str(limits.max_processes))
        env = {"PATH": "/usr/bin:/bin", "HOME": str(scratch), "TMPDIR": str(scratch), "LANG": "C.UTF-8"}
        cmd = [plan.python, "-I", "-S", "-B", "-X", "utf8", "snippet.py"]
        if limits.guard:
            cmd[-1:] = ["sandbox_guard.py", "snippet.py"]
        with (
            (io_dir / "stdin").open("rb") as fin,
            (io_dir / "stdout").open("wb") as fout,
            (io_dir / "stderr").open("wb") as ferr,
        ):
            try:
                proc = subprocess.Popen(
                    cmd,
                    cwd=scratch,
                    env=env,
                    stdin=fin,
                    stdout=fout,
                    stderr=ferr,
                    start_new_session=True,
                    close_fds=True,
                    preexec_fn=functools.partial(_preexec, plan, uid, limits, cgroup),
                )
            except (OSError, subprocess.SubprocessError) as exc:
                return SandboxResult(None, "", "", False, error=f"sandbox start failed: {exc}")
            timed_out = False
            try:
                proc.wait(timeout=limits.timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)  # the snippet and anything it forked
            proc.wait()
        rc = proc.returncode
        timed_out = timed_out or rc == -signal.SIGXCPU
        stdout = _read_head(io_dir / "stdout", limits.max_output_bytes)
        stderr = _read_head(io_dir / "stderr", limits.max_output_bytes)
        return SandboxResult(rc, stdout, stderr, timed_out, uid=uid)
    finally:
        if cgroup is not None:
            _kill_cgroup(cgroup)
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(io_dir, ignore_errors=True)


def run_python(code: str, stdin: str = "", limits: SandboxLimits | None = None) -> SandboxResult:
    """Run ``code`` as a Python program in the sandbox, feeding ``stdin``; never raises for its faults."""
    limits = limits or SandboxLimits()
    return _run(sandbox_plan(limits.user), code, stdin, limits)
