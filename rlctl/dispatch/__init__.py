"""Single-controller runtime: DataProto, ``@register`` dispatch, workers, groups and pools.

Import surface for the driver and for role code::

    from rlctl.dispatch import DataProto, Dispatch, Execute, register, Worker, WorkerGroup, ResourcePool
"""

from rlctl.dispatch.errors import CallTimeoutError, WorkerDiedError, WorkerError
from rlctl.dispatch.futures import DispatchFuture
from rlctl.dispatch.group import WorkerGroup, spawn_colocated
from rlctl.dispatch.mesh import Mesh
from rlctl.dispatch.modes import Dispatch, Execute, register, register_dispatch_mode
from rlctl.dispatch.pool import ResourcePool
from rlctl.dispatch.proto import DataProto
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
    "spawn_colocated",
]
