"""Which sandbox layers this host gives, and whether a sandbox level may run without the others.

Levels (``reward.sandbox``):
- ``strict`` (default): code rewards run only with every required OS layer: a pid namespace
  (everything the snippet starts dies with it), a mount namespace (read-only host view, private
  tmpfs scratch, no home or run directory), a network namespace (no network at all) and an
  unprivileged uid, a seccomp filter (no new namespaces, keyrings, ptrace, raw sockets...) and a
  memory cgroup (``memory_mb`` bounds all of a run's processes together); otherwise
  ``reward.kind = "code"`` fails at start naming the missing layer.
- ``best-effort``: runs with whatever layers the host has; where no pid namespace is possible the
  snippet runs as a uid of its own and every process of that uid is killed afterwards. The
  in-process audit guard and the rlimits apply at every level.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

LEVELS = ("strict", "best-effort")
PID = "pid namespace"
MOUNT = "mount namespace"
NET = "network namespace"
UID = "unprivileged uid"
SECCOMP = "seccomp filter"
MEMORY = "memory cgroup"
NPROC = "process limit"
REQUIRED = (PID, MOUNT, NET, UID, SECCOMP, MEMORY)  # what ``strict`` needs
HOW_TO_GET = {
    PID: "run as root, or where unprivileged user namespaces are allowed (sysctl kernel.unprivileged_userns_clone=1)",
    MOUNT: "run as root, or where unprivileged user namespaces are allowed",
    NET: "run as root, or where unprivileged user namespaces are allowed",
    UID: "run as root with CAP_SETUID (or as a normal user with user namespaces)",
    SECCOMP: "run on Linux x86_64 or aarch64 with seccomp enabled in the kernel (CONFIG_SECCOMP_FILTER)",
    MEMORY: "run as root where the memory cgroup is writable (cgroup v1 /sys/fs/cgroup/memory or a v2 "
    "subtree with the memory controller enabled)",
    NPROC: "make a pids cgroup writable (cgroup v1 /sys/fs/cgroup/pids or a delegated v2 subtree)",
}


@dataclass(frozen=True)
class Layer:
    """One protection: whether it is active here, and what it does or why it is missing."""

    name: str
    active: bool
    detail: str


@dataclass(frozen=True)
class SandboxPlan:
    """How snippets run on this host; probed once per process by ``sandbox.sandbox_plan()``.

    As root each run gets its own uid from ``sandbox.UID_POOL`` (ids with no passwd entry) so
    RLIMIT_NPROC counts only that run's processes; as a normal user the namespaces come from a user
    namespace (``userns``) in which the snippet is an unprivileged uid.
    """

    python: str | None
    uid: int | None  # uid to drop to as root (None: no drop, i.e. not root or not possible)
    gid: int | None
    netns: bool
    pids_cgroup: tuple[str, str] | None  # (base directory, limit file) for per-run pids cgroups
    uid_pool: bool = True  # per-run uids from UID_POOL; False: always ``uid`` (containers with few uids)
    pidns: bool = False
    mountns: bool = False
    userns: bool = False
    memory_cgroup: tuple[str, str] | None = None  # (base directory, limit file) for per-run memory cgroups
    seccomp: bool = False
    missing_why: dict[str, str] = field(default_factory=dict, compare=False)

    @property
    def unprivileged(self) -> bool:
        """Whether the snippet runs without rlctl's privileges (a dropped uid or a user namespace)."""
        return self.uid is not None or self.userns or os.geteuid() != 0

    @property
    def process_limit(self) -> bool:
        """Whether a fork bomb meets a limit: a pids cgroup, or RLIMIT_NPROC on an unprivileged uid."""
        return self.pids_cgroup is not None or self.unprivileged

    def layers(self) -> list[Layer]:
        """Every layer in report order (the audit guard and rlimits always apply)."""
        why = self.missing_why

        def layer(name: str, active: bool, what: str) -> Layer:
            return Layer(name, active, what if active else why.get(name, "not available on this host"))

        uid_what = (
            "snippets run in a user namespace as an unprivileged uid"
            if self.userns
            else (
                "each run gets its own unprivileged uid"
                if self.uid_pool
                else f"snippets run as uid {self.uid}"
            )
            if self.uid is not None
            else "rlctl is not root: snippets run as this user"
        )
        if self.pids_cgroup is not None:
            nproc_what = f"a pids cgroup per run under {self.pids_cgroup[0]}"
        else:
            nproc_what = "RLIMIT_NPROC on the snippet's unprivileged uid"
        return [
            layer(
                PID,
                self.pidns,
                "snippets are init of a fresh pid namespace; all their processes die with them",
            ),
            layer(
                MOUNT,
                self.mountns,
                "read-only view of system dirs, a minimal /etc, private tmpfs scratch, no home or run dir",
            ),
            layer(NET, self.netns, "a fresh network namespace: no interface but a down loopback"),
            layer(UID, self.unprivileged and (self.uid is not None or self.userns), uid_what),
            layer(
                SECCOMP,
                self.seccomp,
                "a fresh session keyring; no new namespaces, keys, ptrace, process_vm, bpf, perf, mounts, io_uring, raw sockets",
            ),
            layer(
                MEMORY,
                self.memory_cgroup is not None,
                f"memory_mb bounds all of a run's processes, shared memory included "
                f"(under {self.memory_cgroup[0] if self.memory_cgroup else ''})",
            ),
            layer(NPROC, self.process_limit, nproc_what),
            Layer("audit guard", True, "in-process audit hook (second layer): writes, sockets, exec, ctypes"),
            Layer("rlimits", True, "CPU time, address space, file size, processes, open files"),
        ]

    def missing(self, level: str = "strict") -> list[Layer]:
        """Layers ``level`` requires that this host lacks (none for ``best-effort``)."""
        if level == "best-effort":
            return []
        if self.python is None:
            return [Layer("interpreter", False, self.missing_why.get("interpreter", "no interpreter runs"))]
        return [lay for lay in self.layers() if lay.name in REQUIRED and not lay.active]


def refusal(plan: SandboxPlan, level: str) -> str | None:
    """One line naming the first missing layer ``level`` needs, or None when it may run."""
    if level not in LEVELS:
        return f"reward.sandbox: expected one of {', '.join(LEVELS)}, got {level!r}"
    if plan.python is None:
        return f"code rewards cannot run: no Python interpreter starts in the sandbox ({plan.missing_why.get('interpreter', '')})"
    missing = plan.missing(level)
    if not missing:
        return None
    first = missing[0]
    names = ", ".join(m.name for m in missing)
    return (
        f"reward.sandbox = {level!r} needs the {first.name} layer, which this host lacks ({first.detail}); "
        f"missing: {names}; {HOW_TO_GET.get(first.name, '')}, or set reward.sandbox = 'best-effort' "
        "to run with fewer layers (rlctl doctor lists them)"
    )
