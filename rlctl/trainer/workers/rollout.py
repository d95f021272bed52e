"""The rollout side of the off-policy modes: rollout engines in their own workers (disaggregated).

In ``trainer.mode = "sync"`` the rollout engine lives inside each PolicyWorker (colocated): one
process runs generation, then training, one after the other. Overlap needs generation and
training to run at the same time, so ``one_step_off`` and ``async`` spawn a second worker group,
:class:`RolloutWorker`, on its own :class:`~rlctl.dispatch.ResourcePool` (named ``rollout``, the
same shape as the cluster's): on Ray these are separate actor processes, in-process separate
worker objects the driver calls from its rollout thread. Weights cross as host tensors through
the driver (``PolicyWorker.full_weights`` -> ``RolloutWorker.update_weights``); each push carries
the weight version, which every generated sample then reports. Each push is checked as the sync
mode's syncs are: the fingerprint (:mod:`rlctl.trainer.state.fingerprint`) of what the engine
stores against the pushed tensors, then the canary (:mod:`rlctl.trainer.state.canary`) where it
is due: the trainer's scores travel with the weights
(:class:`~rlctl.trainer.workers.weight_streams.PublishedWeights`), this worker scores the same
sequence with its engine once the weights are in. A tensor that differs or a gap past the
tolerance fails the push naming the engine, the version and the rank. The verdicts
(``sync/fingerprint_*``, ``sync/canary_*``) go back to the driver, which logs them with every
step trained on batches generated under those weights.

On one CPU host both pools share the same cores: the rollout ranks take half of each host's
cores and the training ranks the other half (``workers._cpu_threads``, one rule for both sides),
so the two together never run more OpenMP threads than the host has cores. On accelerators the
rollout pool needs devices of its own (the capacity check says so before anything starts).
"""

from __future__ import annotations

import time

import torch

from rlctl.dispatch import DataProto, Dispatch, Worker, WorkerGroup, register, remote, spawn_colocated
from rlctl.dispatch.pool import ResourcePool
from rlctl.engines.hf_rollout import HFRolloutEngine
from rlctl.engines.weight_delta import Tally
from rlctl.errors import RunError
from rlctl.trainer.plan.specs import PolicySpec
from rlctl.trainer.state.canary import SyncCanary
from rlctl.trainer.state.fingerprint import SyncCheck
from rlctl.trainer.workers.delta_push import fail
from rlctl.trainer.workers.inflight_swap import SwapHook, WeightBoard
from rlctl.trainer.workers.memory import PeakMemory
from rlctl.trainer.workers.roles import _cpu_threads, rollout_engine, sample_rows
from rlctl.trainer.workers.weight_streams import PublishedWeights


class RolloutWorker(PeakMemory, Worker):
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
    def update_weights(self, published: PublishedWeights, version: int) -> dict[str, float]:
        """Load the trainer's published weights (later samples report ``version``), then check
        them as a sync is checked: the fingerprint of what the engine now stores against the
        published tensors, then, where the trainer sent its scores, the canary (this engine's
        scores of the canary against the trainer's). Returns the ``sync/fingerprint_*`` and
        ``sync/canary_*`` metrics; RunError on a tensor that differs or a gap past the tolerance."""
        version = int(published.version if published.version is not None else version)
        what = f"weight version {version} (rollout worker, {type(self.rollout).__name__})"
        if getattr(self, "swapped", None) is not None and self.swapped[0] == version:
            return self.swapped[1]  # taken in the middle of a generation already, and checked there
        if published.deltas is not None and published.base_version is not None:
            if published.base_version != self.version:  # a gap: the driver sends the full weights
                return {"sync/need_full": 1.0, "sync/held_version": float(self.version)}
            fail(self.rollout.apply_deltas(published.deltas), what, self.rank)
            params, sizes = list(published.samples or []), Tally()
            for delta in published.deltas:
                sizes.add(delta)
            sizes = {**sizes.metrics(), "sync/delta": 1.0}
        else:
            self.rollout.update_weights(published.weights.items())
            params = list(published.weights.items())
            sizes = {"sync/bytes": float(sum(t.numel() * t.element_size() for t in published.weights.values()))}
            if published.deltas is not None or published.version is not None:
                sizes["sync/delta"] = 0.0  # a full push of a delta-sync run
        return self._checked(published, params, sizes, version)

    def _checked(
        self, published: PublishedWeights, params: list, sizes: dict[str, float], version: int
    ) -> dict[str, float]:
        """Weights ``version`` are in the engine: the fingerprint of what it stores against
        ``params``, then the canary where the trainer sent its scores (RunError naming the rank)."""
        self.version = version
        if getattr(self, "push_check", None) is None:
            self.push_check = SyncCheck(rank=self.rank)
        self.push_check.version = self.version - 1  # the check counts this push
        checked = self.push_check.after_sync(
            None,
            self.rollout,
            device=self.spec.engine.device_type,
            params=params,
            what=f"weight version (rollout worker, {type(self.rollout).__name__})",
        )
        checked.pop("sync/weight_version")
        checked.update(sizes)
        if published.canary_scores is None:
            return checked
        start = time.perf_counter()
        if getattr(self, "canary", None) is None:
            engine = self.spec.engine
            self.canary = SyncCanary(
                rank=self.rank,
                train_dtype=engine.mixed_precision or engine.dtype,
                rollout_dtype=self.spec.rollout.dtype,
            )
        tokens = published.canary_tokens
        theirs = self.canary.rollout_scores(self.rollout, tokens, self.spec.engine.device_type)
        out = self.canary.compare(
            theirs,
            published.canary_scores,
            tokens,
            published.model_shape,
            self.version,
            f"{type(self.rollout).__name__} (rollout worker)",
            what="weight version",
            vocab_size=published.canary_vocab,
        )
        return {**checked, **out, "sync/canary_s": published.canary_s + time.perf_counter() - start}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def attach_board(self, board: WeightBoard | None) -> None:
        """Partial rollouts (``trainer.partial_rollouts``): from now on each generation asks
        ``board`` between decode steps for a newer published version and goes on under it. The
        board is the driver's source in-process, on Ray a
        :class:`~rlctl.dispatch.version_board.RayVersionBoard` (a version first, weights only when newer)."""
        if board is not None and not isinstance(self.rollout, HFRolloutEngine):
            raise RunError(f"partial rollouts need the HF rollout engine, got {type(self.rollout).__name__}")
        self.board = board

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """As ``PolicyWorker.generate_sequences`` (same seeds, same padding), with this worker's
        version; with a board attached, the weights may change between decode steps (each swap
        checked as a push is, once the generation returns)."""
        start, board = self.version, getattr(self, "board", None)
        hook = None if board is None else SwapHook(board, start)
        swap = {} if hook is None else {"version": start, "swap": hook}
        out = sample_rows(self.rollout, prompts, self.rank, **swap)
        if hook is not None and hook.last is not None:  # what the engine holds now: checked as a push
            params = list(hook.last.weights.items())
            nbytes = float(sum(t.numel() * t.element_size() for _, t in params))
            self.swapped = (hook.version, self._checked(hook.last, params, {"sync/bytes": nbytes}, hook.version))
        out["weight_version"] = torch.full((out["responses"].shape[0],), start, dtype=torch.long)
        if "token_versions" not in out:  # the engine swapped no weights mid-generation: one version
            out["token_versions"] = out["response_mask"].long() * start
        return DataProto.from_dict(tensors=out, meta={"weight_version": start})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def held_version(self) -> int:
        """The weight version the engine holds (newer than the last push after a swap; each rank
        swaps on its own, so ranks may differ)."""
        return self.version

    @register(dispatch_mode=Dispatch.RANK_ZERO)
    def rollout_log_prob_gap(self, temperature: float, top_p: float, top_k: int) -> str | None:
        return self.rollout.log_prob_gap(temperature=temperature, top_p=top_p, top_k=top_k)


class RolloutGroup(WorkerGroup):
    """The driver's typed handle on the rollout workers (:mod:`rlctl.dispatch.remote`)."""

    init_model = remote(RolloutWorker.init_model)
    update_weights = remote(RolloutWorker.update_weights)
    generate_sequences = remote(RolloutWorker.generate_sequences)
    attach_board = remote(RolloutWorker.attach_board)
    held_version = remote(RolloutWorker.held_version)
    rollout_log_prob_gap = remote(RolloutWorker.rollout_log_prob_gap)
    peak_memory = remote(RolloutWorker.peak_memory)


def spawn_rollout_group(ctx) -> tuple[RolloutGroup, ResourcePool]:
    """The run's rollout workers on a pool of their own (same shape and platform as the trainer's);
    the caller shuts the group down, then releases the pool."""
    p = ctx.profile
    c = p.cluster
    pool = ResourcePool(
        nodes=c.nodes,
        devices_per_node=c.devices_per_node,
        resource=ctx.plan.ray_resource,
        runtime=ctx.platform.runtime_spec(),
        name="rollout",
    )
    group: RolloutGroup = spawn_colocated(  # type: ignore[assignment]  # handles= makes it one
        pool,
        {"rollout": RolloutWorker},
        mesh={"dp": pool.world_size},
        backend=c.backend,
        init_kwargs={"rollout": {"spec": ctx.plan.policy.spec}},  # the run's plan, not a second resolution
        handles={"rollout": RolloutGroup},
        env=ctx.plan.env,
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
