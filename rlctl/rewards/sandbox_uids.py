"""Per-run host uids of the sandbox (as root), and finding and killing a uid's processes.

Each run gets its own uid from ``UID_POOL`` (ids with no passwd entry), so RLIMIT_NPROC counts only
that run's processes and, where no pid namespace is possible, every process of the uid can be
killed afterwards.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import pwd
import signal
import time

from rlctl.log import get_logger
from rlctl.rewards.sandbox_layers import SandboxPlan

UID_POOL = range(61000, 65000)
_run_counter = itertools.count()


def run_uid(plan: SandboxPlan) -> int | None:
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


def kill_uid(uid: int) -> bool:
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
