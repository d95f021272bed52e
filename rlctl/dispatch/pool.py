"""``ResourcePool``: a reservation of devices, one Ray placement group per node.

Each node gets a STRICT_PACK placement group of ``devices_per_node`` bundles of the platform's Ray
resource (``CPU``, ``GPU``, ``NPU``). With several nodes, each placement group is pinned to a
distinct node (label selector on ``ray.io/node-id``) chosen in (ip, node id) order, so rank r lands
on the same node and bundle after a restart of the same cluster. Several worker groups may share a
pool (each host takes ``1 / max_groups`` of its bundle); disjoint pools give disaggregated roles.
The in-process backend only reads the shape.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from rlctl.errors import RunError, UserError
from rlctl.platforms.runtime_spec import CPU_RUNTIME, RuntimeSpec


@dataclass
class ResourcePool:
    """``nodes`` x ``devices_per_node`` devices of ``resource``; ranks go node by node."""

    nodes: int
    devices_per_node: int
    resource: str = "CPU"
    cpus_per_device: float = 1.0
    max_groups: int = 4
    name: str = ""
    ready_timeout_s: float = 120.0
    runtime: RuntimeSpec | None = None  # the platform's devices (``Platform.runtime_spec``); CPU if None
    # every worker sees its node's devices (Ray is asked not to narrow visibility, through the
    # platform's RAY_EXPERIMENTAL_NOSET_* variable) and runs on the one Ray assigned it: for a
    # rollout engine that drives a replica's devices from one rank (SGLang at TP > 1)
    node_devices: bool = False
    _pgs: list[Any] = field(default_factory=list, repr=False, init=False)
    _node_ids: list[str] = field(default_factory=list, repr=False, init=False)

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.devices_per_node < 1:
            raise UserError(
                f"ResourcePool needs nodes >= 1 and devices_per_node >= 1, got {self.nodes} x {self.devices_per_node}"
            )
        if self.max_groups < 1:
            raise UserError(f"ResourcePool.max_groups must be >= 1, got {self.max_groups}")
        if self.runtime is not None and self.runtime.ray_resource != self.resource:
            raise UserError(
                f"ResourcePool: resource {self.resource!r} is not the platform's Ray resource "
                f"{self.runtime.ray_resource!r} ({self.runtime.device_type})"
            )

    def runtime_spec(self) -> RuntimeSpec:
        """The devices the workers on this pool run on: the platform's, or the CPU for a CPU pool.
        A pool of accelerators without them is a UserError (there is no table to guess from)."""
        if self.runtime is not None:
            return self.runtime
        if self.resource == "CPU":
            return CPU_RUNTIME
        raise UserError(
            f"ResourcePool(resource={self.resource!r}) needs runtime=platform.runtime_spec() to know "
            "its workers' torch device and collective backend"
        )

    @property
    def world_size(self) -> int:
        return self.nodes * self.devices_per_node

    def bundle(self) -> dict[str, float]:
        """Resources of one device's bundle."""
        if self.resource == "CPU":
            return {"CPU": self.cpus_per_device}
        b = {self.resource: 1.0}
        if self.cpus_per_device:
            b["CPU"] = self.cpus_per_device
        return b

    def actor_options(self) -> dict[str, Any]:
        """Ray actor options for one host: a ``1 / max_groups`` share of its bundle."""
        share = 1.0 / self.max_groups
        opts: dict[str, Any] = {"num_cpus": self.cpus_per_device * share}
        if self.resource == "GPU":
            opts["num_gpus"] = share
        elif self.resource != "CPU":
            opts["resources"] = {self.resource: share}
        return opts

    def placement_groups(self) -> list[Any]:
        """Create (once) and return the per-node placement groups in rank order."""
        if self._pgs:
            return self._pgs
        import ray
        from ray.util.placement_group import placement_group

        from rlctl.dispatch.capacity import require_capacity

        require_capacity(self)  # one-line RunError now, instead of a group that can never be placed
        bundles = [self.bundle() for _ in range(self.devices_per_node)]
        targets = self._pick_nodes() if self.nodes > 1 else [None]
        pgs = []
        for i, node_id in enumerate(targets):
            kw: dict[str, Any] = {
                "strategy": "STRICT_PACK",
                "name": f"{self.name}-node{i}" if self.name else "",
            }
            if node_id is None:
                pgs.append(placement_group(bundles, **kw))
                continue
            try:
                pgs.append(
                    placement_group(
                        bundles, bundle_label_selector=[{"ray.io/node-id": node_id}] * len(bundles), **kw
                    )
                )
            except TypeError:  # Ray without label selectors: a soft hint, checked once placed
                pgs.append(placement_group(bundles, _soft_target_node_id=node_id, **kw))
        deadline = time.monotonic() + self.ready_timeout_s
        for i, pg in enumerate(pgs):
            left = max(1.0, deadline - time.monotonic())
            ready, _ = ray.wait([pg.ready()], timeout=left)
            if not ready:
                for p in pgs:
                    ray.util.remove_placement_group(p)
                raise RunError(
                    f"resource pool {self.name or '(unnamed)'}: placement group {i} ({self.devices_per_node} x "
                    f"{self.bundle()}) not placed within {self.ready_timeout_s:.0f}s; cluster resources: "
                    f"{ray.available_resources()}"
                )
        self._pgs = pgs
        self._node_ids = [self._pg_node(pg) for pg in pgs]
        if len(set(self._node_ids)) != len(pgs):
            self.release()
            raise RunError(
                f"resource pool {self.name or '(unnamed)'}: node groups share a node ({self._node_ids})"
            )
        return pgs

    def node_ids(self) -> list[str]:
        """The Ray node id each placement group landed on (after ``placement_groups()``)."""
        return list(self._node_ids)

    def _pick_nodes(self) -> list[str]:
        import ray

        need = self.bundle()
        alive = []
        for n in ray.nodes():
            res = n.get("Resources", {})
            if n.get("Alive") and all(res.get(k, 0) >= v * self.devices_per_node for k, v in need.items()):
                alive.append((n.get("NodeManagerAddress", ""), n["NodeID"]))
        if len(alive) < self.nodes:
            raise RunError(
                f"resource pool {self.name or '(unnamed)'} needs {self.nodes} nodes with "
                f"{self.devices_per_node} x {need}, the cluster has {len(alive)} such nodes"
            )
        return [node_id for _, node_id in sorted(alive)[: self.nodes]]

    @staticmethod
    def _pg_node(pg: Any) -> str:
        from ray.util import placement_group_table

        table = placement_group_table(pg)
        nodes = set(table.get("bundles_to_node_id", {}).values())
        return nodes.pop() if len(nodes) == 1 else ",".join(sorted(nodes))

    def release(self) -> None:
        """Remove the placement groups (the worker groups on them must be shut down first)."""
        if not self._pgs:
            return
        import ray

        for pg in self._pgs:
            ray.util.remove_placement_group(pg)
        self._pgs, self._node_ids = [], []
