"""Run an untrusted Python snippet contained by the OS, with time, memory, process and file limits.

The OS does the containing (``sandbox_launch.py`` builds it; ``sandbox_layers.py`` names the
layers and the levels): a fresh pid namespace whose init is the snippet, so everything it starts
dies with it; a mount namespace with a read-only view of the system directories and a private
tmpfs scratch (cwd, HOME, TMPDIR); a network namespace with no network; an unprivileged per-run
uid; a minimal ``/etc``; a fresh session keyring; a seccomp filter (``sandbox_seccomp.py``); a
memory cgroup bounding all of a run's processes and a pids cgroup (``sandbox_cgroup.py``);
rlimits (CPU, address space, file size, processes, open files). The in-process audit hook
(``sandbox_guard.py``) is a second layer only.

With ``tests``, the tests run in a process of their own that calls the snippet's process over a
pipe (``sandbox_verdict.py``); the run passes only when that process *witnessed* the tests run
to their last statement: it writes back a per-run nonce that never enters the snippet's process
(``SandboxResult.witnessed``). The tests reach the sandbox as an open fd of an unlinked file.

``sandbox_plan()`` probes once which layers this host gives. At level ``strict`` (the default) a
snippet never runs when a required layer is missing: ``require_sandbox()`` raises at start and
``run_python`` refuses. Where no pid namespace is possible (``best-effort``), every process of the
run's uid is killed afterwards.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import platform
import pwd
import secrets
import shutil
import signal
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from rlctl.errors import UserError
from rlctl.log import get_logger
from rlctl.rewards.sandbox_cgroup import make_run_cgroups, oom_killed, probe_cgroup, remove_cgroups
from rlctl.rewards.sandbox_layers import LEVELS, MEMORY, MOUNT, NET, PID, SECCOMP, UID, SandboxPlan, refusal
from rlctl.rewards.sandbox_seccomp import AUDIT_ARCH, seccomp_filter, syscall_numbers
from rlctl.rewards.sandbox_spawn import launch, read_bytes, read_head
from rlctl.rewards.sandbox_uids import UID_POOL, kill_uid, live_pids_of_uid, run_uid

__all__ = [
    "UID_POOL",
    "live_pids_of_uid",
    "SandboxLimits",
    "SandboxPlan",
    "SandboxResult",
    "require_sandbox",
    "run_python",
    "sandbox_plan",
]

GUARD_SOURCE = Path(__file__).with_name("sandbox_guard.py")
VERDICT_SOURCE = Path(__file__).with_name("sandbox_verdict.py")
SYSTEM_DIRS = (
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
)  # /etc: a minimal one is written
JUDGE_SETUP_FAILED = 125  # sandbox_verdict.SETUP_FAILED: the judge (pid 1 with tests) could not start
WITNESS_FDS = (100, 101, 102)  # sandbox_launch.WITNESS_FDS: the nonce in, the witness out, the tests in


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
    witnessed: bool = False  # with ``tests``: the guard saw the tests run to their last statement
    out_of_memory: bool = False  # the run's memory cgroup OOM-killed one of its processes

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
        if self.out_of_memory:
            return "out of memory (the run's memory cgroup)"
        if self.returncode is not None and self.returncode < 0:
            return f"killed by {signal.Signals(-self.returncode).name}"
        last = next((ln for ln in reversed(self.stderr.splitlines()) if ln.strip()), "")
        if self.returncode == 0:
            return "ok"
        return f"exit {self.returncode}: {last}" if last else f"exit {self.returncode}"


def _ro_paths(python: str) -> list[str]:
    """System directories plus the interpreter's prefix, for the read-only view."""
    prefix = os.path.dirname(os.path.dirname(os.path.realpath(python)))
    paths = list(SYSTEM_DIRS)
    if not any(prefix == d or prefix.startswith(d + "/") for d in paths if not os.path.islink(d)):
        paths.append(prefix)
    return paths


def _run(
    plan: SandboxPlan, code: str, stdin: str, limits: SandboxLimits, tests: str | None = None
) -> SandboxResult:
    if plan.python is None:
        return SandboxResult(None, "", "", False, error="no sandbox interpreter available")
    io_dir = Path(tempfile.mkdtemp(prefix="rlctl-sbx-io-"))  # rlctl's own; the snippet never sees it
    scratch: Path | None = None
    cgroups: list[str] = []
    uid = None if plan.userns else run_uid(plan)
    gid = plan.gid
    nonce = secrets.token_hex(32).encode()
    try:
        files = ["snippet.py", "sandbox_guard.py"]  # tests.py reaches the sandbox as an fd, never a file
        (io_dir / "snippet.py").write_text(code, encoding="utf-8")
        shutil.copyfile(GUARD_SOURCE, io_dir / "sandbox_guard.py")
        if tests is not None:
            files.append("sandbox_verdict.py")
            shutil.copyfile(VERDICT_SOURCE, io_dir / "sandbox_verdict.py")
        if tests is not None:
            (io_dir / "tests.py").write_text(tests, encoding="utf-8")
            (io_dir / "nonce").write_bytes(nonce)
        (io_dir / "stdin").write_text(stdin, encoding="utf-8")
        if plan.mountns:
            work = "/tmp"
        else:
            work = str(_plain_scratch(io_dir, files, uid, gid))
            scratch = Path(work)
        budgets = {plan.pids_cgroup: limits.max_processes, plan.memory_cgroup: limits.memory_mb << 20}
        cgroups = make_run_cgroups({spec: v for spec, v in budgets.items() if spec is not None})
        python = os.path.realpath(plan.python) if plan.mountns else plan.python
        argv = [python, "-I", "-S", "-B", "-X", "utf8"]
        if limits.guard:
            argv.append("sandbox_guard.py")
            if tests is not None:
                argv += ["--verdict", *map(str, WITNESS_FDS)]
        argv.append("snippet.py")
        fsize = max(limits.max_file_mb * 1024 * 1024, limits.max_output_bytes)
        program = seccomp_filter() if plan.seccomp else None
        cfg = {
            "io_dir": str(io_dir),
            "root": str(io_dir / "root"),
            "files": files,
            "scratch": work,
            "scratch_mb": limits.scratch_mb,
            "ro_paths": _ro_paths(plan.python),
            "parent_pid": os.getpid(),
            "cgroups": cgroups,
            "pidns": plan.pidns,
            "mountns": plan.mountns,
            "netns": plan.netns,
            "userns": plan.userns,
            "uid": uid,
            "gid": gid if uid is not None else None,
            "argv": argv,
            "env": {"PATH": "/usr/bin:/bin", "HOME": work, "TMPDIR": work, "LANG": "C.UTF-8"},
            "seccomp": program.hex() if program else None,
            "keyctl_nr": _keyctl_nr(),
            "witness": tests is not None and limits.guard,
            "rlimits": {
                "RLIMIT_CPU": int(limits.timeout_s) + 1,
                "RLIMIT_AS": limits.memory_mb * 1024 * 1024,
                "RLIMIT_FSIZE": fsize,
                "RLIMIT_NPROC": limits.max_processes,
                "RLIMIT_NOFILE": 64,
                "RLIMIT_CORE": 0,
            },
        }
        (io_dir / "config.json").write_text(json.dumps(cfg))
        status, timed_out = launch(io_dir, limits.timeout_s)
        if not plan.pidns:  # nothing took the snippet's other processes with it: find them
            with contextlib.suppress(OSError, ValueError):
                os.killpg(int((io_dir / "init_pid").read_text()), signal.SIGKILL)
            if uid is not None and plan.uid_pool:
                kill_uid(uid)
        if status.get("error") and "wait_status" not in status:
            return SandboxResult(None, "", "", timed_out, error=f"sandbox setup failed: {status['error']}")
        stdout = read_head(io_dir / "stdout", limits.max_output_bytes)
        stderr = read_head(io_dir / "stderr", limits.max_output_bytes)
        if status.get("error"):
            return SandboxResult(
                None, stdout, stderr, timed_out, error=f"sandbox setup failed: {status['error']}"
            )
        rc = os.waitstatus_to_exitcode(status["wait_status"]) if "wait_status" in status else None
        if tests is not None and limits.guard and rc == JUDGE_SETUP_FAILED:  # the judge's code, not the snippet's
            last = stderr.strip().splitlines()[-1:] or ["(no message)"]
            return SandboxResult(None, stdout, stderr, timed_out, error=f"sandbox setup failed: {last[0]}")
        timed_out = timed_out or rc == -signal.SIGXCPU
        witnessed = tests is not None and read_bytes(io_dir / "witness") == nonce
        oom = oom_killed(cgroups)
        return SandboxResult(rc, stdout, stderr, timed_out, uid=uid, witnessed=witnessed, out_of_memory=oom)
    except OSError as exc:
        return SandboxResult(None, "", "", False, error=f"sandbox setup failed: {exc}")
    finally:
        remove_cgroups(cgroups)
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(io_dir, ignore_errors=True)


def _plain_scratch(io_dir: Path, files: list[str], uid: int | None, gid: int | None) -> Path:
    """A private scratch directory on the host (no mount namespace) holding the run's files."""
    scratch = Path(tempfile.mkdtemp(prefix="rlctl-sbx-"))
    for name in files:
        shutil.copyfile(io_dir / name, scratch / name)
        if uid is not None:
            os.chown(scratch / name, uid, gid)
    if uid is not None:
        os.chown(scratch, uid, gid)
    os.chmod(scratch, 0o700)
    return scratch


def _keyctl_nr() -> int | None:
    machine = platform.machine()
    return syscall_numbers(machine)["keyctl"] if machine in AUDIT_ARCH else None


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
    pids_cgroup = probe_cgroup("pids") if root else None
    layers = {"pidns": True, "mountns": True, "netns": True}  # plan field -> value when on
    why: dict[str, str] = {}
    if seccomp_filter() is not None:
        layers["seccomp"] = True
    else:
        why[SECCOMP] = f"no filter for this architecture ({platform.machine()})"
    memory_cgroup = probe_cgroup("memory") if root else None
    if memory_cgroup is not None:
        layers["memory_cgroup"] = memory_cgroup
    else:
        why[MEMORY] = "no writable memory cgroup here" + ("" if root else " (rlctl is not root)")
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
    names = {"pidns": PID, "mountns": MOUNT, "netns": NET, "seccomp": SECCOMP, "memory_cgroup": MEMORY}
    for exe in exes:
        for who in ids:
            base = SandboxPlan(exe, netns=False, pids_cgroup=pids_cgroup, **who)
            full = replace(base, userns=not root, **layers)
            err = _try(full)
            if err is None:
                return _logged(log, replace(full, missing_why=_why(why, who, root)))
            why.setdefault("all", err)
            # some layer is missing: find which ones work alone, then together
            works = {}
            for key, value in layers.items():
                err = _try(replace(base, userns=not root, **{key: value}))
                if err is None:
                    works[key] = value
                else:
                    why.setdefault(names[key], err)
            if works:
                combo = replace(base, userns=not root, **works)
                if _try(combo) is None:
                    return _logged(log, replace(combo, missing_why=_why(why, who, root)))
            err = _try(base)
            if err is None:
                return _logged(log, replace(base, missing_why=_why(why, who, root)))
            why.setdefault("interpreter", err)
    log.warning("sandbox: no interpreter runs under the sandbox's limits; code rewards cannot run")
    return SandboxPlan(
        None, uid, gid, False, pids_cgroup, missing_why={"interpreter": why.get("interpreter", "")}
    )


def _why(why: dict[str, str], who: dict, root: bool) -> dict[str, str]:
    out = {k: v for k, v in why.items() if k in (PID, MOUNT, NET, SECCOMP, MEMORY)}
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


def run_python(
    code: str, stdin: str = "", limits: SandboxLimits | None = None, tests: str | None = None
) -> SandboxResult:
    """Run ``code`` as a Python program in the sandbox, feeding ``stdin``; never raises for its faults.

    ``tests`` (Python test code) runs in a process of its own against ``code``'s names; ``witnessed`` on the result
    says whether the tests reached their end (exiting early or faking output cannot set it).

    At level ``strict`` nothing runs where a required layer is missing: the result's ``error``
    names it (``require_sandbox`` raises the same line at start).
    """
    limits = limits or SandboxLimits()
    plan = sandbox_plan(limits.user)
    msg = refusal(plan, limits.level)
    if msg is not None:
        return SandboxResult(None, "", "", False, error=f"sandbox refused: {msg}")
    return _run(plan, code, stdin, limits, tests)
