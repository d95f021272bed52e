"""Per-run cgroups of the sandbox: a pids limit and a memory limit for *all* of a run's processes.

RLIMIT_AS bounds one process's address space; a run of N processes (or memfd/tmpfs pages, which
no process maps) escapes it. A memory cgroup charges every page the run's processes touch,
shared memory and its tmpfs scratch included, and the kernel OOM-kills inside the cgroup when the
run passes ``memory_mb``. Both cgroup v1 (``/sys/fs/cgroup/<controller>``) and a v2 subtree whose
controllers are enabled are used; swap is limited to nothing, so the limit cannot be paged out.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid

from rlctl.log import get_logger

# controller -> [(base directory, limit file)], first that works wins (v1 first, then v2)
CANDIDATES = {
    "pids": (("/sys/fs/cgroup/pids", "pids.max"), ("/sys/fs/cgroup", "pids.max")),
    "memory": (("/sys/fs/cgroup/memory", "memory.limit_in_bytes"), ("/sys/fs/cgroup", "memory.max")),
}
_NO_SWAP = {"memory.limit_in_bytes": "memory.memsw.limit_in_bytes", "memory.max": "memory.swap.max"}


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def probe_cgroup(controller: str) -> tuple[str, str] | None:
    """``(base, limit file)`` where a per-run cgroup of ``controller`` can be made and limited."""
    for base, limit_file in CANDIDATES[controller]:
        probe = os.path.join(base, f"rlctl-probe-{os.getpid()}-{uuid.uuid4().hex[:6]}")
        try:
            os.mkdir(probe)
        except OSError:
            continue
        try:
            _write(os.path.join(probe, limit_file), "8" if controller == "pids" else str(64 << 20))
            return base, limit_file
        except OSError:
            continue
        finally:
            with contextlib.suppress(OSError):
                os.rmdir(probe)
    return None


def make_run_cgroups(limits: dict[tuple[str, str], int]) -> list[str]:
    """One fresh cgroup per base with each ``(base, limit file) -> value`` written; their paths.

    The caller removes them with :func:`remove_cgroups` (also when this raises part-way).
    """
    made: dict[str, str] = {}
    try:
        for (base, limit_file), value in limits.items():
            path = made.get(base)
            if path is None:
                path = os.path.join(base, f"rlctl-sbx-{uuid.uuid4().hex}")
                os.mkdir(path)
                made[base] = path
            _write(os.path.join(path, limit_file), str(value))
            no_swap = _NO_SWAP.get(limit_file)
            if no_swap and os.path.exists(os.path.join(path, no_swap)):
                _write(os.path.join(path, no_swap), str(value) if no_swap.startswith("memory.memsw") else "0")
    except OSError:
        remove_cgroups(list(made.values()))
        raise
    return list(made.values())


def remove_cgroups(paths: list[str]) -> None:
    """Kill every process left in each cgroup, then remove it (best effort, bounded)."""
    for path in paths:
        for _ in range(100):
            try:
                with open(os.path.join(path, "cgroup.procs")) as f:
                    pids = [int(p) for p in f.read().split()]
            except OSError:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            try:
                os.rmdir(path)
                break
            except OSError:
                time.sleep(0.02)
        else:
            get_logger("rlctl.sandbox").warning("sandbox cgroup not removed", cgroup=path)


def oom_killed(paths: list[str]) -> bool:
    """Whether the kernel OOM-killed a process of the run's memory cgroup (v1 or v2 counters)."""
    for path in paths:
        for name, key in (("memory.events", "oom_kill"), ("memory.oom_control", "oom_kill")):
            with contextlib.suppress(OSError, ValueError):
                with open(os.path.join(path, name)) as f:
                    fields = dict(line.split() for line in f if len(line.split()) == 2)
                if int(fields.get(key, 0)) > 0:
                    return True
    return False
