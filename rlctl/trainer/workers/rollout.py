"""The rollout side of the off-policy modes: rollout engines in their own workers (disaggregated).

In ``trainer.mode = "sync"`` the rollout engine lives inside each PolicyWorker (colocated): one
process runs generation, then training, one after the other. Overlap needs generation and
training to run at the same time, so ``one_step_off`` and ``async`` spawn a second worker group,
:class:`RolloutWorker`, on its own :class:`~rlctl.dispatch.ResourcePool` (named ``rollout``, the
same shape as the cluster's): on Ray these are separate actor processes, in-process separate
worker objects the driver calls from its rollout thread. Weights cross as host tensors through
the driver (``PolicyWorker.full_weights`` -> ``RolloutWorker.update_weights``); each push carries
the weight version, which every generated sample then reports.

On one CPU host both pools share the same cores: the rollout ranks take half of each host's
cores and the training ranks the other half (``workers._cpu_threads``, one rule for both sides),
so the two together never run more OpenMP threads than the host has cores. On accelerators the
rollout pool needs devices of its own (the capacity check says so before anything starts).
"""

from __future__ import annotations

import torch

from rlctl.dispatch import DataProto, Dispatch, Worker, WorkerGroup, register, spawn_colocated
from rlctl.dispatch.pool import ResourcePool
from rlctl.engines.engine_fields import resolve_engine_kwargs
from rlctl.trainer.plan import choices
from rlctl.trainer.plan.specs import PolicySpec, build_specs
from rlctl.trainer.workers.roles import _cpu_threads, rollout_engine, sample_rows


class RolloutWorker(Worker):
    """One rank's rollout engine, fed weights by the driver; no training engine."""

    def __init__(self, spec: PolicySpec) -> None:
        super().__init__()
        self.spec = spec
        self.version = 0

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        _cpu_threads(self, self.spec.engine, side="rollout")  # half the host; training has the rest
        self.rollout = rollout_engine(self.spec)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def update_weights(self, weights: dict[str, torch.Tensor], version: int) -> int:
        """Load the trainer's full weights; later samples report ``version``. Returns tensors copied."""
        count = self.rollout.update_weights(weights.items())
        self.version = int(version)
        return count

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """As ``PolicyWorker.generate_sequences`` (same seeds, same padding), with this worker's version."""
        out = sample_rows(self.rollout, prompts, self.rank)
        out["weight_version"] = torch.full((out["responses"].shape[0],), self.version, dtype=torch.long)
        return DataProto.from_dict(tensors=out, meta={"weight_version": self.version})

    @register(dispatch_mode=Dispatch.RANK_ZERO)
    def rollout_log_prob_gap(self, temperature: float, top_p: float, top_k: int) -> str | None:
        return self.rollout.log_prob_gap(temperature=temperature, top_p=top_p, top_k=top_k)


def spawn_rollout_group(ctx) -> tuple[WorkerGroup, ResourcePool]:
    """The run's rollout workers on a pool of their own (same shape and platform as the trainer's);
    the caller shuts the group down, then releases the pool."""
    p, platform = ctx.profile, ctx.platform
    attn = p.platform.attention if p.platform.attention != "auto" else platform.attention_impl()
    engine = choices.rollout_engine(p, platform)
    specs = build_specs(
        p,
        device_type=platform.device_type,
        dtype=choices.compute_dtype(p, platform),
        attn=attn,
        dist_backend=platform.dist_backend,
        rollout_engine=engine,
        vendor=platform.name,
        rollout_engine_kwargs=resolve_engine_kwargs(
            platform, engine, p.rollout.engine_kwargs, where=f"{p.source}: rollout.engine_kwargs"
        ),
    )
    c = p.cluster
    pool = ResourcePool(
        nodes=c.nodes, devices_per_node=c.devices_per_node, resource=platform.ray_resource, name="rollout"
    )
    group = spawn_colocated(
        pool,
        {"rollout": RolloutWorker},
        mesh={"dp": pool.world_size},
        backend=c.backend,
        init_kwargs={"rollout": {"spec": specs.policy}},
        env=platform.rollout_env(),
        address=c.address,
        default_timeout=c.call_timeout_s,
    )["rollout"]
    try:
        group.init_model()
    except BaseException:
        group.shutdown()
        pool.release()
        raise
    return group, pool
