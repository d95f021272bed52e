"""Refuse at once when the Ray cluster can never hold the profile's devices.

Why: a Ray placement group that asks for more ``GPU`` / ``NPU`` / ``CPU`` than the cluster has is
not an error for Ray, it waits. On a ROCm host where Ray 2.60 cannot count the GPUs (no ``amdsmi``
package) Ray reports 0 GPUs, so every run would wait. :func:`require_capacity` compares the pool
with the cluster's *total* resources (what is busy now may free up; what is not there never will)
and raises a one-line :class:`~rlctl.errors.RunError` (exit code 1) naming the shortfall.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from rlctl.errors import RunError


class PoolShape(Protocol):
    """What the check needs from a ``ResourcePool``."""

    nodes: int
    devices_per_node: int
    resource: str
    name: str

    def bundle(self) -> dict[str, float]: ...


def _fmt(x: float) -> str:
    return f"{x:g}"


def _node_fits(resources: Mapping[str, float], need: Mapping[str, float]) -> bool:
    return all(float(resources.get(k, 0.0)) >= v for k, v in need.items())


def shortfall(pool: PoolShape, nodes: Sequence[Mapping[str, Any]]) -> str | None:
    """Why ``pool`` can never be placed on a cluster of ``nodes`` (``ray.nodes()`` entries), or None."""
    need = {k: v * pool.devices_per_node for k, v in pool.bundle().items()}  # one STRICT_PACK group
    alive = [dict(n.get("Resources") or {}) for n in nodes if n.get("Alive", True)]
    if sum(_node_fits(r, need) for r in alive) >= pool.nodes:
        return None
    res = pool.resource
    total = sum(float(r.get(res, 0.0)) for r in alive)
    largest = max((float(r.get(res, 0.0)) for r in alive), default=0.0)
    with_devices = [r for r in alive if float(r.get(res, 0.0)) >= pool.devices_per_node]
    pool_name = f"resource pool {pool.name}: " if pool.name else ""
    if len(with_devices) >= pool.nodes:  # the devices are there; another part of the bundle is not
        short = next(
            (k for k, v in need.items() if sum(_node_fits(r, {k: v}) for r in alive) < pool.nodes), res
        )
        best = max((float(r.get(short, 0.0)) for r in with_devices), default=0.0)
        return (
            f"{pool_name}each node needs {_fmt(need[short])} {short} for {pool.devices_per_node} {res} "
            f"bundles, the largest Ray node has {_fmt(best)} {short}"
        )
    where = f"at most {_fmt(largest)} on one node"
    if pool.nodes > 1:
        where += f", {len(with_devices)} node(s) with {pool.devices_per_node}"
    return (
        f"{pool_name}Ray sees {_fmt(total)} {res} in the cluster ({where}) but the profile needs "
        f"{pool.nodes} node(s) x {pool.devices_per_node} {res} (cluster.nodes x cluster.devices_per_node)"
    )


def device_hint(resource: str, host: Any = None) -> str:
    """Why Ray may see fewer devices than this host has (cheap file reads, no vendor library)."""
    from rlctl.platforms.host import Host

    host = host if host is not None else Host()
    if resource == "GPU" and host.exists("/dev/kfd"):
        from rlctl.platforms.rocm import RocmPlatform

        status, reason, fix = RocmPlatform(host).ray_gpu_check()
        if status == "fail":
            return f"{reason}; {fix}"
    if resource == "GPU" and host.exists("/sys/module/nvidia") and not host.glob("/dev", "nvidia[0-9]*"):
        return (
            "this host shows the NVIDIA kernel module but no /dev/nvidia* (a container without GPU access?)"
        )
    if resource == "CPU":
        return "start Ray with more CPUs (ray start --num-cpus N) or lower cluster.devices_per_node"
    return "`rlctl doctor` on each node shows what its devices and Ray need"


def require_capacity(
    pool: PoolShape, nodes: Sequence[Mapping[str, Any]] | None = None, hint: str | None = None
) -> None:
    """Raise ``RunError`` (one line) when the Ray cluster can never place ``pool``.

    ``nodes`` defaults to ``ray.nodes()`` of the connected cluster; ``hint`` to :func:`device_hint`.
    """
    if nodes is None:
        import ray

        nodes = ray.nodes()
    why = shortfall(pool, nodes)
    if why is None:
        return
    hint = device_hint(pool.resource) if hint is None else hint
    raise RunError(f"{why}; {hint}" if hint else why)
