"""``Worker`` (the base class of SPMD role code) and ``WorkerHost`` (one process per device).

A host is what a backend places on a device: a Ray actor, or a plain object in-process. It holds
one Worker instance per role colocated on that device (actor + rollout + ref share one process,
one CUDA context and one torch.distributed world), and runs calls addressed to ``(role, method)``.
Worker code is the same for both backends: a Worker only sees its ``WorkerContext``.
"""

from __future__ import annotations

import os
import socket
import traceback
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

import torch

from rlctl.devices import DeviceRuntime
from rlctl.dispatch.errors import WorkerError
from rlctl.dispatch.futures import execute_on_rank
from rlctl.dispatch.mesh import Mesh
from rlctl.dispatch.modes import registered_methods
from rlctl.platforms.runtime_spec import CPU_RUNTIME, RuntimeSpec


@dataclass(frozen=True)
class WorkerContext:
    """Everything a rank knows about its place; set by the group before ``__init__`` runs."""

    role: str
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    mesh: Mesh
    master_addr: str
    master_port: int
    runtime_spec: RuntimeSpec = CPU_RUNTIME  # the platform's devices (``Platform.runtime_spec``)
    device_index: int | None = None  # None: the one visible device of this process (Ray sets visibility)
    in_process: bool = False

    @property
    def device_type(self) -> str:
        return self.runtime_spec.device_type


class Worker:
    """Base class of role code. Subclasses define ``@register`` methods; ``__init__`` may take kwargs.

    ``rank``, ``world_size``, ``mesh_coords``, ``device`` are valid from the start of ``__init__``.
    """

    _rlctl_ctx: WorkerContext

    @property
    def ctx(self) -> WorkerContext:
        return self._rlctl_ctx

    @property
    def role(self) -> str:
        return self._rlctl_ctx.role

    @property
    def rank(self) -> int:
        return self._rlctl_ctx.rank

    @property
    def world_size(self) -> int:
        return self._rlctl_ctx.world_size

    @property
    def local_rank(self) -> int:
        return self._rlctl_ctx.local_rank

    @property
    def mesh(self) -> Mesh:
        return self._rlctl_ctx.mesh

    @property
    def mesh_coords(self) -> dict[str, int]:
        return self._rlctl_ctx.mesh.coords(self.rank)

    @property
    def device_runtime(self) -> DeviceRuntime:
        """The platform's runtime half for this rank's devices (module, set_device, memory)."""
        return DeviceRuntime(self._rlctl_ctx.runtime_spec)

    @property
    def device(self) -> torch.device:
        return self.device_runtime.device(self._rlctl_ctx.device_index)

    def init_distributed(self, backend: str | None = None, timeout_s: float = 600.0) -> None:
        """Join this group's torch.distributed world (idempotent; colocated roles share it).

        ``backend`` defaults to the platform's collective (its ``RuntimeSpec.dist_backend``).
        In-process groups can only do this with world_size 1.
        """
        import torch.distributed as dist

        c = self._rlctl_ctx
        if c.in_process and c.world_size > 1:
            raise RuntimeError(
                f"init_distributed: the in-process backend runs all {c.world_size} ranks of role {c.role!r} "
                "sequentially in one process, so they cannot form a torch.distributed world; "
                "use world_size 1 in-process, or backend='ray' for multi-rank collectives"
            )
        if dist.is_initialized():
            if dist.get_world_size() != c.world_size or dist.get_rank() != c.rank:
                raise RuntimeError(
                    f"torch.distributed is already initialised as rank {dist.get_rank()}/{dist.get_world_size()} "
                    f"in this process; role {c.role!r} needs rank {c.rank}/{c.world_size}"
                )
            return
        runtime = self.device_runtime
        backend = backend or runtime.dist_backend
        runtime.set_device(c.device_index)
        dist.init_process_group(
            backend,
            init_method=f"tcp://{c.master_addr}:{c.master_port}",
            rank=c.rank,
            world_size=c.world_size,
            timeout=timedelta(seconds=timeout_s),
        )


def free_port() -> int:
    """A TCP port free on this host right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def node_id() -> str | None:
    try:
        import ray

        if ray.is_initialized():
            return ray.get_runtime_context().get_node_id()
    except Exception:  # ray missing or not connected
        pass
    return None


def node_ip() -> str:
    try:
        import ray

        if ray.is_initialized():
            return ray.util.get_node_ip_address()
    except Exception:  # ray missing or not connected: fall back to the loopback
        pass
    return "127.0.0.1"


class WorkerHost:
    """One device's process: the Worker instances of every role colocated there."""

    def __init__(
        self,
        rank: int,
        world_size: int,
        env: dict[str, str] | None = None,
        in_process: bool = False,
        runtime: RuntimeSpec | None = None,
        node_devices: bool = False,
    ):
        """``runtime`` (Ray hosts): the pool's devices, whose Ray-assigned id picks this host's
        device; ``node_devices``: Ray was asked to leave the node's devices visible, so that id
        must be found (device 0 would be every rank's)."""
        self.rank, self.world_size, self.in_process = rank, world_size, in_process
        self.workers: dict[str, Worker] = {}
        self.specs: dict[str, dict[str, Any]] = {}
        if env and not in_process:
            os.environ.update(env)
        self.runtime, self.node_devices = runtime, node_devices
        self.device_index: int | None = None

    def info(self) -> dict[str, Any]:
        """Where this host runs, its device (the index among the devices it sees, None for the
        first) and a port that rank 0 can serve torch.distributed on."""
        if self.runtime is not None and not self.in_process:
            from rlctl.dispatch.ray_devices import own_device

            self.device_index = own_device(self.runtime, self.rank, self.node_devices)
        vis = None if self.runtime is None else self.runtime.visible_devices_env
        return {
            "pid": os.getpid(),
            "ip": node_ip(),
            "node_id": None if self.in_process else node_id(),
            "hostname": socket.gethostname(),
            "free_port": free_port(),
            "device_index": self.device_index,
            "visible_devices": os.environ.get(vis) if vis else None,
        }

    def add_role(self, cls: type, init_kwargs: dict[str, Any], ctx: WorkerContext) -> int:
        """Construct ``cls`` for ``ctx.role`` with its context already in place; returns the pid."""
        if ctx.role in self.workers:
            raise ValueError(f"role {ctx.role!r} already lives on rank {self.rank}")
        if ctx.device_index is None and self.device_index is not None:  # the device Ray assigned
            ctx = replace(ctx, device_index=self.device_index)
        if not self.in_process:
            os.environ.update(
                RANK=str(ctx.rank),
                WORLD_SIZE=str(ctx.world_size),
                LOCAL_RANK=str(ctx.local_rank),
                LOCAL_WORLD_SIZE=str(ctx.local_world_size),
                MASTER_ADDR=ctx.master_addr,
                MASTER_PORT=str(ctx.master_port),
            )
        try:
            obj = cls.__new__(cls)
            obj._rlctl_ctx = ctx
            obj.__init__(**init_kwargs)
        except Exception as exc:
            raise WorkerError(
                ctx.role, "__init__", ctx.rank, f"{type(exc).__name__}: {exc}", traceback.format_exc()
            ) from None
        self.workers[ctx.role] = obj
        self.specs[ctx.role] = registered_methods(cls)
        return os.getpid()

    def call(self, role: str, method: str, args: tuple, kwargs: dict, fetch: Any = None) -> Any:
        """Run ``role.method`` on this rank; any exception becomes a WorkerError naming the rank."""
        try:
            fn = getattr(self.workers[role], method)
            return execute_on_rank(fn, args, kwargs, fetch or _no_fetch)
        except WorkerError as exc:
            if exc.role == role and exc.method == method:
                raise
            raise WorkerError(role, method, self.rank, f"an input failed upstream: {exc}") from None
        except Exception as exc:
            raise WorkerError(
                role, method, self.rank, f"{type(exc).__name__}: {exc}", traceback.format_exc()
            ) from None


def _no_fetch(parts: dict[int, Any]) -> dict[int, Any]:
    raise RuntimeError("this backend cannot resolve lazy inputs")
