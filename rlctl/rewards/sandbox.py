"""Run an untrusted Python snippet contained by the OS, with time, memory, process and file limits.

The OS does the containing (``sandbox_launch.py`` builds it; ``sandbox_layers.py`` names the
layers and the levels): a fresh pid namespace whose init is the snippet, so everything it starts
dies with it; a mount namespace with a read-only view of the system directories and a private
tmpfs scratch (cwd, HOME, TMPDIR); a network namespace with no network; an unprivileged per-run
uid; rlimits (CPU, address space, file size, processes, open files) and a pids cgroup where
writable. The in-process audit hook (``sandbox_guard.py``) is a second layer only.

``sandbox_plan()`` probes once which layers this host gives. At level ``strict`` (the default) a
snippet never runs when a required layer is missing: ``require_sandbox()`` raises at start and
``run_python`` refuses. Where no pid namespace is possible (``best-effort``), every process of the
run's uid is killed afterwards.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, replace
from pathlib import Path

from rlctl.errors import UserError
from rlctl.log import get_logger
from rlctl.rewards.sandbox_layers import LEVELS, MOUNT, NET, PID, UID, SandboxPlan, refusal

__all__ = ["SandboxLimits", "SandboxPlan", "SandboxResult", "require_sandbox", "run_python", "sandbox_plan"]

GUARD_SOURCE = Path(__file__).with_name("sandbox_guard.py")
LAUNCHER = Path(__file__).with_name("sandbox_launch.py")
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
UID_POOL = range(61000, 65000)
_run_counter = itertools.count()
_KILL_GRACE_S = 5.0  # how long the launcher gets to reap a killed namespace before it is killed too


@dataclass(frozen=True)
class SandboxLimits:
    """Limits of one sandboxed run."""

    timeout_s: float = 5.0
    memory_mb: int = 512
    max_processes: int = 32
    max_output_bytes: int = 1 << 16
    max_file_mb: int = 16
    scratch_mb: int = 64  # size of the private tmpfs scratch (mount namespace)
    user: str = "nobody"  # whose group the snippet gets when rlctl runs as root
    guard: bool = True  # also run the in-process audit-hook guard (off only to test the OS layers)
    level: str = "strict"  # "strict": refuse without every OS layer; "best-effort": use what there is


@dataclass
class SandboxResult:
    """What a run did; ``ok`` means it exited 0 within the limits."""

    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool
    error: str | None = None  # the sandbox refused or could not start the snippet
    uid: int | None = None  # the host uid the snippet ran as (None: rlctl's own, or a user namespace)

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out and self.error is None

    @property
    def reason(self) -> str:
        """One line: why the run did not pass (``"ok"`` when it did)."""
        if self.error is not None:
            return self.error
        if self.timed_out:
            return "timed out"
        if self.returncode is not None and self.returncode < 0:
            return f"killed by {signal.Signals(-self.returncode).name}"
        last = next((ln for ln in reversed(self.stderr.splitlines()) if ln.strip()), "")
        if self.returncode == 0:
            return "ok"
        return f"exit {self.returncode}: {last}" if last else f"exit {self.returncode}"


def _run_uid(plan: SandboxPlan) -> int | None:
    """A host uid for one run: cycles through the pool, skipping ids that name real users."""
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


def _ro_paths(python: str) -> list[str]:
    """System directories plus the interpreter's prefix, for the read-only view."""
    prefix = os.path.dirname(os.path.dirname(os.path.realpath(python)))
    paths = list(SYSTEM_DIRS)
    if not any(prefix == d or prefix.startswith(d + "/") for d in paths if not os.path.islink(d)):
        paths.append(prefix)
    return paths


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


def live_pids_of_uid(uid: int) -> list[int]:
    """Pids of live (non-zombie) processes whose real or effective uid is ``uid``."""
    pids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/status") as f:
                status = f.read()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        uids = fields.get("Uid", "").split()[:2]
        if str(uid) in uids and not fields.get("State", "").strip().startswith(("Z", "X")):
            pids.append(int(entry.name))
    return pids


def _kill_uid(uid: int) -> bool:
    """SIGKILL every process of a per-run uid until none is left (no pid namespace to do it)."""
    for _ in range(200):
        pids = live_pids_of_uid(uid)
        if not pids:
            return True
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.005)
    get_logger("rlctl.sandbox").warning("sandbox: processes of the run's uid survive", uid=uid)
    return False


def _read_head(path: Path, limit: int) -> str:
    with path.open("rb") as f:
        return f.read(limit).decode("utf-8", errors="replace")


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _stop(launcher: subprocess.Popen, io_dir: Path) -> None:
    """Kill a run that is past its time: its pid-namespace init (which takes the rest), then the launcher."""
    with contextlib.suppress(OSError, ValueError):
        if not (io_dir / "status.json").exists():  # the launcher has not reaped its child: the pid is valid
            os.kill(int((io_dir / "init_pid").read_text()), signal.SIGKILL)
    try:
        launcher.wait(timeout=_KILL_GRACE_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(launcher.pid, signal.SIGKILL)
        launcher.wait()


def _run(plan: SandboxPlan, code: str, stdin: str, limits: SandboxLimits) -> SandboxResult:
    if plan.python is None:
        return SandboxResult(None, "", "", False, error="no sandbox interpreter available")
    io_dir = Path(tempfile.mkdtemp(prefix="rlctl-sbx-io-"))  # rlctl's own; the snippet never sees it
    scratch: Path | None = None
    cgroup = None
    uid = None if plan.userns else _run_uid(plan)
    gid = plan.gid
    try:
        (io_dir / "snippet.py").write_text(code, encoding="utf-8")
        shutil.copyfile(GUARD_SOURCE, io_dir / "sandbox_guard.py")
        (io_dir / "stdin").write_text(stdin, encoding="utf-8")
        if plan.mountns:
            work = "/tmp"
        else:
            scratch = Path(tempfile.mkdtemp(prefix="rlctl-sbx-"))
            for name in ("snippet.py", "sandbox_guard.py"):
                shutil.copyfile(io_dir / name, scratch / name)
                if uid is not None:
                    os.chown(scratch / name, uid, gid)
            if uid is not None:
                os.chown(scratch, uid, gid)
            os.chmod(scratch, 0o700)
            work = str(scratch)
        if plan.cgroup_base is not None:
            cgroup = os.path.join(plan.cgroup_base, f"rlctl-sbx-{uuid.uuid4().hex}")
            os.mkdir(cgroup)
            with open(os.path.join(cgroup, "pids.max"), "w") as f:
                f.write(str(limits.max_processes))
        python = os.path.realpath(plan.python) if plan.mountns else plan.python
        argv = [python, "-I", "-S", "-B", "-X", "utf8"]
        argv += ["sandbox_guard.py", "snippet.py"] if limits.guard else ["snippet.py"]
        cpu = int(limits.timeout_s) + 1
        mem = limits.memory_mb * 1024 * 1024
        fsize = max(limits.max_file_mb * 1024 * 1024, limits.max_output_bytes)
        cfg = {
            "io_dir": str(io_dir),
            "root": str(io_dir / "root"),
            "scratch": work,
            "scratch_mb": limits.scratch_mb,
            "ro_paths": _ro_paths(plan.python),
            "parent_pid": os.getpid(),
            "cgroup": cgroup,
            "pidns": plan.pidns,
            "mountns": plan.mountns,
            "netns": plan.netns,
            "userns": plan.userns,
            "uid": uid,
            "gid": gid if uid is not None else None,
            "argv": argv,
            "env": {"PATH": "/usr/bin:/bin", "HOME": work, "TMPDIR": work, "LANG": "C.UTF-8"},
            "rlimits": {
                "RLIMIT_CPU": cpu,
                "RLIMIT_AS": mem,
                "RLIMIT_FSIZE": fsize,
                "RLIMIT_NPROC": limits.max_processes,
                "RLIMIT_NOFILE": 64,
                "RLIMIT_CORE": 0,
            },
        }
        (io_dir / "config.json").write_text(json.dumps(cfg))
        with (
            (io_dir / "stdin").open("rb") as fin,
            (io_dir / "stdout").open("wb") as fout,
            (io_dir / "stderr").open("wb") as ferr,
        ):
            try:
                launcher = subprocess.Popen(
                    [sys.executable, "-I", "-S", "-B", str(LAUNCHER), str(io_dir / "config.json")],
                    cwd=io_dir,
                    env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
                    stdin=fin,
                    stdout=fout,
                    stderr=ferr,
                    start_new_session=True,
                    close_fds=True,
                )
            except OSError as exc:
                return SandboxResult(None, "", "", False, error=f"sandbox start failed: {exc}")
            timed_out = False
            try:
                launcher.wait(timeout=limits.timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                _stop(launcher, io_dir)
        status = _read_json(io_dir / "status.json")
        if not plan.pidns:  # nothing took the snippet's other processes with it: find them
            with contextlib.suppress(OSError, ValueError):
                os.killpg(int((io_dir / "init_pid").read_text()), signal.SIGKILL)
            if uid is not None and plan.uid_pool:
                _kill_uid(uid)
        if status.get("error") and "wait_status" not in status:
            return SandboxResult(None, "", "", timed_out, error=f"sandbox setup failed: {status['error']}")
        stdout = _read_head(io_dir / "stdout", limits.max_output_bytes)
        stderr = _read_head(io_dir / "stderr", limits.max_output_bytes)
        if status.get("error"):
            return SandboxResult(
                None, stdout, stderr, timed_out, error=f"sandbox setup failed: {status['error']}"
            )
        rc = os.waitstatus_to_exitcode(status["wait_status"]) if "wait_status" in status else None
        timed_out = timed_out or rc == -signal.SIGXCPU
        return SandboxResult(rc, stdout, stderr, timed_out, uid=uid)
    finally:
        if cgroup is not None:
            _kill_cgroup(cgroup)
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(io_dir, ignore_errors=True)


_PROBE = "import sys; print(sys.version_info[0])"


def _try(plan: SandboxPlan) -> str | None:
    """None if ``plan`` runs a trivial snippet, else why not (one line)."""
    res = _run(plan, _PROBE, "", SandboxLimits(timeout_s=10, level="best-effort"))
    if res.ok and res.stdout.strip() == "3":
        return None
    return res.reason


def sandbox_plan(user: str = "nobody") -> SandboxPlan:
    """Probe which layers this host gives and find an interpreter that runs inside them (cached)."""
    return _probe_plan(user)


@functools.cache
def _probe_plan(user: str) -> SandboxPlan:
    root = os.geteuid() == 0
    uid = gid = None
    if root:
        try:
            pw = pwd.getpwnam(user)
            uid, gid = pw.pw_uid, pw.pw_gid
        except KeyError:
            uid = gid = 65534
    cgroup_base = _probe_cgroup() if root else None
    candidates = [sys.executable, getattr(sys, "_base_executable", None), "/usr/bin/python3"]
    candidates += [shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")]
    exes = list(dict.fromkeys(c for c in candidates if c and os.path.exists(c)))
    log = get_logger("rlctl.sandbox")
    ids = (
        [dict(uid=uid, gid=gid, uid_pool=True), dict(uid=uid, gid=gid, uid_pool=False)]
        if root
        else [dict(uid=None, gid=None, uid_pool=False)]
    )
    if root:
        ids.append(dict(uid=None, gid=None, uid_pool=False))  # last resort: no unprivileged uid at all
    why: dict[str, str] = {}
    for exe in exes:
        for who in ids:
            base = SandboxPlan(exe, netns=False, cgroup_base=cgroup_base, **who)
            ns = dict(pidns=True, mountns=True, netns=True, userns=not root)
            full = replace(base, **ns)
            err = _try(full)
            if err is None:
                return _logged(log, full)
            why.setdefault("all", err)
            # some layer is missing: find which ones work alone, then together
            works = {}
            for key, name in (("pidns", PID), ("mountns", MOUNT), ("netns", NET)):
                err = _try(replace(base, userns=not root, **{key: True}))
                works[key] = err is None
                if err is not None:
                    why.setdefault(name, err)
            if any(works.values()):
                combo = replace(base, userns=not root, **works)
                if _try(combo) is None:
                    return _logged(log, replace(combo, missing_why=_why(why, who, root)))
            err = _try(base)
            if err is None:
                return _logged(log, replace(base, missing_why=_why(why, who, root)))
            why.setdefault("interpreter", err)
    log.warning("sandbox: no interpreter runs under the sandbox's limits; code rewards cannot run")
    return SandboxPlan(
        None, uid, gid, False, cgroup_base, missing_why={"interpreter": why.get("interpreter", "")}
    )


def _why(why: dict[str, str], who: dict, root: bool) -> dict[str, str]:
    out = {k: v for k, v in why.items() if k in (PID, MOUNT, NET)}
    if root and who.get("uid") is None:
        out[UID] = "switching to an unprivileged uid failed (no CAP_SETUID?)"
    return out


def _logged(log, plan: SandboxPlan) -> SandboxPlan:
    missing = [lay.name for lay in plan.layers() if not lay.active]
    if missing:
        log.warning("sandbox: layers missing on this host", missing=", ".join(missing))
    log.info("sandbox plan", python=plan.python, pidns=plan.pidns, mountns=plan.mountns, netns=plan.netns)
    return plan


def require_sandbox(level: str = "strict", user: str = "nobody") -> SandboxPlan:
    """The plan, or UserError (one line naming the missing layer) when ``level`` may not run here."""
    if level not in LEVELS:
        raise UserError(f"reward.sandbox: expected one of {', '.join(LEVELS)}, got {level!r}")
    plan = sandbox_plan(user)
    msg = refusal(plan, level)
    if msg is not None:
        raise UserError(msg)
    return plan


def run_python(code: str, stdin: str = "", limits: SandboxLimits | None = None) -> SandboxResult:
    """Run ``code`` as a Python program in the sandbox, feeding ``stdin``; never raises for its faults.

    At level ``strict`` nothing runs where a required layer is missing: the result's ``error``
    names it (``require_sandbox`` raises the same line at start).
    """
    limits = limits or SandboxLimits()
    plan = sandbox_plan(limits.user)
    msg = refusal(plan, limits.level)
    if msg is not None:
        return SandboxResult(None, "", "", False, error=f"sandbox refused: {msg}")
    return _run(plan, code, stdin, limits)
