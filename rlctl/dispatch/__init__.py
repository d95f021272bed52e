"""Single-controller runtime: DataProto, ``@register`` dispatch, workers, groups and pools.

Role code (identical for both backends)::

    class ActorWorker(Worker):
        def __init__(self, model_path: str):
            self.init_distributed(platform.dist_backend)    # rank/world/mesh are already known
            ...

        @register(Dispatch.DP_COMPUTE_PROTO)
        def compute_log_prob(self, batch: DataProto) -> DataProto: ...

        @register(Dispatch.DP_COMPUTE_PROTO, blocking=False)
        def generate_sequences(self, prompts: DataProto) -> DataProto: ...

Driver::

    pool = ResourcePool(1, 4, platform.ray_resource, runtime=platform.runtime_spec())
    groups = spawn_colocated(pool, {"actor": ActorWorker, "ref": RefWorker}, mesh={"dp": 4},
                             init_kwargs={"actor": {...}}, backend="ray")   # or "inprocess"
    gen = groups["actor"].generate_sequences(prompts)          # a DispatchFuture (non-blocking)
    ref = groups["ref"].compute_ref_log_prob(gen, timeout=600)   # ranks fetch gen's outputs themselves
    batch = gen.get().union(ref)

Typed handles: a ``WorkerGroup`` subclass declaring the methods the driver calls,
``compute_log_prob = remote(ActorWorker.compute_log_prob)``, passed as
``spawn_colocated(..., handles={"actor": ActorGroup})``, makes ``groups["actor"].compute_log_prob``
resolve statically to the worker's method (:mod:`rlctl.dispatch.remote`).

Failures raise ``WorkerError`` (a ``RunError``; ``.role``, ``.method``, ``.rank``, remote
traceback; ``.with_step(step)``), ``WorkerDiedError`` for a dead process, ``CallTimeoutError``.
"""

from rlctl.dispatch.errors import CallTimeoutError, WorkerDiedError, WorkerError
from rlctl.dispatch.futures import DispatchFuture
from rlctl.dispatch.group import WorkerGroup, spawn_colocated
from rlctl.dispatch.mesh import Mesh
from rlctl.dispatch.modes import Dispatch, Execute, register, register_dispatch_mode
from rlctl.dispatch.pool import ResourcePool
from rlctl.dispatch.proto import DataProto
from rlctl.dispatch.remote import remote
from rlctl.dispatch.worker import Worker, WorkerContext

__all__ = [
    "CallTimeoutError",
    "DataProto",
    "Dispatch",
    "DispatchFuture",
    "Execute",
    "Mesh",
    "ResourcePool",
    "Worker",
    "WorkerContext",
    "WorkerDiedError",
    "WorkerError",
    "WorkerGroup",
    "register",
    "register_dispatch_mode",
    "remote",
    "spawn_colocated",
]
