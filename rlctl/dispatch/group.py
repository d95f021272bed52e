"""``WorkerGroup``: the driver's handle on one role; ``spawn_colocated`` puts several roles per device.

``wg.compute_log_prob(batch)`` looks up the method's ``@register`` mode, builds one payload per
rank (``modes.plan_call``), launches them on the backend, and collects. Non-blocking methods (or
``blocking=False`` per call) return a ``DispatchFuture`` that can be handed to the next call as is.
Colocation: one host per device holds a Worker per role; each role gets its own WorkerGroup over
the same hosts (same processes, same torch.distributed world), so the driver code is unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlctl.dispatch.futures import CallInfo, DispatchFuture
from rlctl.dispatch.mesh import Mesh
from rlctl.dispatch.modes import Execute, MethodSpec, get_mode, plan_call, registered_methods
from rlctl.dispatch.pool import ResourcePool
from rlctl.dispatch.remote import declared_methods
from rlctl.dispatch.worker import WorkerContext
from rlctl.errors import UserError

BACKENDS = ("ray", "inprocess")


def make_backend(name: str, address: str | None = None) -> Any:
    if name == "ray":
        from rlctl.dispatch.backend_ray import RayBackend, require_ray

        require_ray()
        return RayBackend(address)
    if name == "inprocess":
        from rlctl.dispatch.backend_inprocess import InProcessBackend

        return InProcessBackend()
    raise UserError(f"worker group backend {name!r} is not one of {', '.join(BACKENDS)}")


class _Hosts:
    """The processes of a set of colocated groups; killed when the last group shuts down."""

    def __init__(self, backend: Any, handles: list[Any], infos: list[dict]):
        self.backend, self.handles, self.infos = backend, handles, infos
        self.members: set[str] = set()

    def release(self, role: str) -> None:
        self.members.discard(role)
        if not self.members and self.handles:
            self.backend.kill(self.handles)
            self.handles = []


class GroupMethod:
    """``wg.<method>``: call it like the worker method; ``timeout=`` and ``blocking=`` are driver-side."""

    def __init__(self, group: WorkerGroup, name: str, spec: MethodSpec):
        self.group, self.name, self.spec = group, name, spec
        self.__doc__ = getattr(getattr(group.worker_cls, name), "__doc__", None)

    def __call__(
        self, *args: Any, timeout: float | None = None, blocking: bool | None = None, **kwargs: Any
    ) -> Any:
        return self.group._call(self.name, self.spec, args, kwargs, timeout, blocking)

    def __repr__(self) -> str:
        return f"<{self.group.role}.{self.name} {self.spec.mode}>"


class WorkerGroup:
    """All ranks of one role. ``WorkerGroup(pool, cls, ...)`` spawns its own processes."""

    def __init__(
        self,
        pool: ResourcePool,
        cls: type,
        role: str = "actor",
        mesh: Mapping[str, int] | Mesh | None = None,
        backend: str = "ray",
        init_kwargs: Mapping[str, Any] | None = None,
        env: Mapping[str, str] | None = None,
        address: str | None = None,
        default_timeout: float | None = None,
        init_timeout: float | None = 600.0,
    ) -> None:
        groups = spawn_colocated(
            pool,
            {role: cls},
            mesh=mesh,
            backend=backend,
            init_kwargs={role: dict(init_kwargs or {})},
            env=env,
            address=address,
            default_timeout=default_timeout,
            init_timeout=init_timeout,
        )
        self.__dict__.update(groups[role].__dict__)
        self._bind_methods()

    @classmethod
    def _attach(
        cls,
        hosts: _Hosts,
        worker_cls: type,
        role: str,
        mesh: Mesh,
        pids: list[int],
        default_timeout: float | None,
    ) -> WorkerGroup:
        wg = cls.__new__(cls)
        wg._hosts, wg.worker_cls, wg.role, wg.mesh, wg.pids = hosts, worker_cls, role, mesh, pids
        wg.default_timeout = default_timeout
        hosts.members.add(role)
        wg._bind_methods()
        return wg

    def _bind_methods(self) -> None:
        """A typed handle's declared methods (:mod:`.remote`) must be the worker's; any other
        ``@register`` method is attached by name (``wg.<method>``)."""
        self.methods = registered_methods(self.worker_cls)
        declared = declared_methods(type(self))
        missing = sorted(set(declared) - set(self.methods))
        if missing:
            raise UserError(
                f"{type(self).__name__} declares {', '.join(missing)}, which {self.worker_cls.__name__} "
                "has no @register method for"
            )
        for name, spec in self.methods.items():
            if name in declared:
                continue
            if name in WorkerGroup.__dict__ or name in ("pids", "mesh", "role", "methods", "worker_cls"):
                raise UserError(
                    f"{self.worker_cls.__name__}.{name} clashes with a WorkerGroup attribute; rename it"
                )
            setattr(self, name, GroupMethod(self, name, spec))

    def method(self, name: str) -> GroupMethod:
        """``wg.<name>`` as a callable (a typed handle's declared methods come through here)."""
        if name not in self.methods:
            raise AttributeError(f"{self.worker_cls.__name__} has no @register method {name!r}")
        return GroupMethod(self, name, self.methods[name])

    # ---- properties ----------------------------------------------------------------------------
    @property
    def backend(self) -> str:
        return self._hosts.backend.name

    @property
    def world_size(self) -> int:
        return self.mesh.world_size

    @property
    def dp_size(self) -> int:
        return self.mesh.dp_size

    @property
    def host_info(self) -> list[dict]:
        """Per rank: pid, ip, hostname of the process it runs in."""
        return list(self._hosts.infos)

    # ---- calls ---------------------------------------------------------------------------------
    def call(
        self,
        method: str,
        *args: Any,
        timeout: float | None = None,
        blocking: bool | None = None,
        **kwargs: Any,
    ) -> Any:
        """Same as ``wg.<method>(...)``, by name."""
        if method not in self.methods:
            raise AttributeError(f"{self.worker_cls.__name__} has no @register method {method!r}")
        return self._call(method, self.methods[method], args, kwargs, timeout, blocking)

    def _call(
        self,
        name: str,
        spec: MethodSpec,
        args: tuple,
        kwargs: dict,
        timeout: float | None,
        blocking: bool | None,
    ) -> Any:
        if not self._hosts.handles:
            raise UserError(f"worker group {self.role!r} was shut down; cannot call {name}")
        mode = get_mode(spec.mode)
        execute = spec.execute or mode.default_execute
        timeout = self.default_timeout if timeout is None else timeout
        payloads, wanted = plan_call(mode, Execute(execute), self.mesh, args, kwargs)
        info = CallInfo(self.role, name)
        backend = self._hosts.backend
        parts, sizes = backend.submit(info, self._hosts.handles, payloads, set(wanted), timeout)
        fut = DispatchFuture(info, parts, mode.collect_fn, wanted, self.mesh, backend, timeout, sizes)
        blocking = spec.blocking if blocking is None else blocking
        return fut.get() if blocking else fut

    def shutdown(self) -> None:
        """Stop this role; the processes go when no colocated role uses them any more."""
        self._hosts.release(self.role)

    def __repr__(self) -> str:
        return (
            f"WorkerGroup(role={self.role!r}, cls={self.worker_cls.__name__}, mesh={self.mesh.as_dict()}, "
            f"backend={self.backend})"
        )


def spawn_colocated(
    pool: ResourcePool,
    roles: Mapping[str, type],
    mesh: Mapping[str, int] | Mesh | None = None,
    backend: str = "ray",
    init_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
    env: Mapping[str, str] | None = None,
    address: str | None = None,
    meshes: Mapping[str, Mapping[str, int]] | None = None,
    default_timeout: float | None = None,
    init_timeout: float | None = 600.0,
    handles: Mapping[str, type[WorkerGroup]] | None = None,
) -> dict[str, WorkerGroup]:
    """One process per device of ``pool`` holding every role in ``roles`` (constructed in order).

    ``mesh`` applies to all roles unless ``meshes[role]`` overrides it (e.g. rollout tp=2 next to an
    actor with dp=4 on the same 4 devices). ``handles[role]``: the typed handle class (a
    ``WorkerGroup`` subclass declaring the worker's methods, :mod:`.remote`) the role's group is.
    Returns ``{role: WorkerGroup}``.
    """
    if not roles:
        raise UserError("spawn_colocated needs at least one role")
    named = set(init_kwargs or {}) | set(meshes or {}) | set(handles or {})
    unknown = named - set(roles)
    if unknown:
        raise UserError(
            f"init_kwargs/meshes/handles name roles {sorted(unknown)} that are not in {sorted(roles)}"
        )
    role_meshes = {}
    for role in roles:
        spec = (meshes or {}).get(role, mesh)
        try:
            role_meshes[role] = Mesh.of(spec, pool.world_size)
        except ValueError as exc:
            raise UserError(f"role {role!r}: {exc}") from None
    be = make_backend(backend, address)
    processes, infos = be.spawn_hosts(pool, dict(env or {}))
    hosts = _Hosts(be, processes, infos)
    master_addr, master_port = infos[0]["ip"], int(infos[0]["free_port"])
    device = pool.runtime_spec()
    groups: dict[str, WorkerGroup] = {}
    try:
        for role, cls in roles.items():
            ctxs = [
                WorkerContext(
                    role=role,
                    rank=r,
                    world_size=pool.world_size,
                    local_rank=r % pool.devices_per_node,
                    local_world_size=pool.devices_per_node,
                    mesh=role_meshes[role],
                    master_addr=master_addr,
                    master_port=master_port,
                    runtime_spec=device,
                    device_index=(r if backend == "inprocess" and not device.is_cpu else None),
                    in_process=backend == "inprocess",
                )
                for r in range(pool.world_size)
            ]
            pids = be.add_role(processes, cls, dict((init_kwargs or {}).get(role, {})), ctxs, init_timeout)
            handle = (handles or {}).get(role, WorkerGroup)
            groups[role] = handle._attach(hosts, cls, role, role_meshes[role], pids, default_timeout)
    except BaseException:
        be.kill(processes)
        raise
    return groups
