"""``trainer.mode`` one_step_off and async: batches generated ahead of the trainer, on workers of their own.

:class:`Pipeline` runs the loop's rollout stage (prompts, generation, rewards, DAPO's rounds) for
batch ``b`` on a thread of its own while step ``b - 1`` trains, on rollout workers in their own
pool (:mod:`rlctl.trainer.workers.rollout`). Two rules make a mode (``loops/modes.py``):

- ``max_staleness``: batch ``b`` is generated only with a version ``>= b - max_staleness``
  (:class:`~rlctl.trainer.loops.pipeline.RolloutPipeline` holds the gate), so no trained sample
  lags further; checked again when the step logs it (``async/staleness_*``).
- ``exact``: batch ``b`` uses exactly version ``max(first, b - max_staleness)``, whatever the
  threads' timing (one_step_off: reproducible given a seed); otherwise the newest published one
  (async).

After each update the loop publishes the policy's weights (``PolicyWorker.full_weights``, not
waited for: the rollout workers fetch rank 0's copy themselves), and the thread loads them into
the rollout workers before its next generation, where each push is checked (fingerprint, and
canary where due); those ``sync/*`` travel with every batch generated under those weights.
Every sample is corrected (decoupled PPO): ``rollout_is_weights = exp(old_log_prob -
rollout_log_prob)`` multiply the policy loss (``algorithm.rollout_correction = "off"`` means token
level here: :func:`~rlctl.trainer.plan.specs.effective_rollout_correction`).

Validation runs on the policy's colocated engine, synced only before one, and pauses the thread
(:meth:`Pipeline.paused`), so the two never share the cores. A checkpoint of an exact pipeline
holds the next batch, generated with weights the checkpoint does not hold (``loops/pending.py``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from rlctl.dispatch import DataProto
from rlctl.dispatch.futures import LazyInput
from rlctl.dispatch.version_board import RayVersionBoard
from rlctl.errors import RunError, UserError
from rlctl.trainer.loops.carry import CarriedRollouts
from rlctl.trainer.loops.pending import load_carried, load_pending, save_carried, save_pending
from rlctl.trainer.loops.pipeline import Produced, RolloutPipeline
from rlctl.trainer.loops.source import Rollout, RolloutStage
from rlctl.trainer.state.fingerprint import merge_push_metrics
from rlctl.trainer.step.memory import peak_memory_metrics
from rlctl.trainer.step.stages import StageTimer
from rlctl.trainer.workers.delta_push import DELTA_KEYS
from rlctl.trainer.workers.rollout import spawn_rollout_group


def staleness_metrics(
    versions: torch.Tensor, step: int, tokens: torch.Tensor | None = None, mask: torch.Tensor | None = None
) -> dict[str, float]:
    """``async/*``: how many policy versions the step's samples lag the policy they train; with
    per-token versions (``tokens``, ``mask`` the response mask) ``async/staleness_min/mean/max``
    are over response tokens (a sequence whose weights were swapped mid-generation counts each
    token at its own version), else over sequences."""
    lag = (step - versions).float()
    out = {
        "async/staleness_mean": lag.mean().item(),
        "async/staleness_max": lag.max().item(),
        "async/staleness_min": lag.min().item(),
        "async/weight_version_min": versions.min().item(),
        "async/weight_version_max": versions.max().item(),
        "rollout/weight_version": versions.min().item(),
    }
    if tokens is not None and mask is not None and bool(mask.any()):
        per_token = (step - tokens)[mask.bool()].float()
        out.update(
            {
                "async/staleness_mean": per_token.mean().item(),
                "async/staleness_max": per_token.max().item(),
                "async/staleness_min": per_token.min().item(),
                "async/staleness_seq_mean": lag.mean().item(),
            }
        )
    return out


def token_versions(batch: DataProto) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(per-token weight versions, response mask) of a batch, or (None, None) without them."""
    if "token_versions" not in batch.batch:
        return None, None
    return batch.batch["token_versions"], batch.batch["response_mask"]


class Pipeline:
    """Batches made ahead on the rollout workers, at most ``max_staleness`` versions old."""

    colocated = False

    def __init__(self, ctx: Any, *, exact: bool, max_staleness: int) -> None:
        self.ctx, self.exact, self.max_staleness = ctx, exact, max_staleness
        self.prompts = ctx.train_data  # drawn from by the thread, ahead of the trainer
        self.consumed: dict | None = None  # the stream's position after the last batch trained
        self.gate = threading.Lock()  # held by a generation or a validation: never both at once
        self.ready: list[Produced] = []  # batches a resumed checkpoint brought
        self.stage: RolloutStage | None = None
        self.group = None  # the rollout workers, while running
        self.pipeline: RolloutPipeline | None = None
        self.push_checks: dict[str, float] = {}  # the checks of the weights the rollout workers hold
        # trainer.partial_rollouts = "swap": the rollout workers take newer weights mid-generation (newer())
        self.partial = False  # set by running() from the profile
        # trainer.partial_rollouts = "carry": rows unfinished at a round's cut go on in the next round
        self.carry: CarriedRollouts | None = None
        self.carried: DataProto | None = None  # the prompts drawn but untrained: after a resume, then per step
        self.futures: dict[int, Any] = {}  # version -> the policy's full_weights call
        self.remote_board: RayVersionBoard | None = None  # partial rollouts on Ray: the workers' board

    # -- the loop's side -----------------------------------------------------------------------------
    @contextmanager
    def running(self, stage: RolloutStage, *, done: int, last: int) -> Iterator[None]:
        """The rollout workers and the thread for batches ``done + 1 .. last``. An exact pipeline
        runs to the profile's last step even when ``--max-steps`` stops earlier, so its last
        checkpoint holds the next batch, one update stale as the uninterrupted run's."""
        self.stage = stage
        self.partial = self.ctx.profile.trainer.partial_rollouts == "swap"
        self.group, pool = spawn_rollout_group(self.ctx)
        self.carry = self._carry() if self.ctx.profile.trainer.partial_rollouts == "carry" else None
        try:
            self._check_rollout_log_probs()
            ready, self.ready = self.ready, []
            version = done + 1  # the policy's weights now: version s + 1 after step s
            self.pipeline = RolloutPipeline(
                self._produce,
                self._push,
                first=version + len(ready),
                last=self.ctx.profile.trainer.steps if self.exact else last,
                version=version,
                weights=self._weights(version),
                max_staleness=self.max_staleness,
                exact=self.exact,
                ready=ready,
                chain=self.ctx.profile.rollout.delta_sync,  # delta pushes: every version, in order
            )
            if self.partial:
                self.group.attach_board(self._board(version))
            self.pipeline.start()
            try:
                yield
            finally:
                self.pipeline.close()
        finally:
            if self.remote_board is not None:
                self.remote_board.close()
                self.remote_board = None
            self.group.shutdown()
            pool.release()

    def next(self, step: int, timer: StageTimer) -> Rollout:
        """Batch ``step`` from the thread; ``time/gen`` and ``time/reward`` are its own (overlapped)
        seconds, ``time/wait_rollout`` what the trainer waited for it."""
        item, waited = self.pipeline.next(step)
        timer.seconds.update(item.seconds)
        timer.seconds["wait_rollout"] = waited
        self.consumed, self.carried = item.data_state, item.carried
        return Rollout(item.batch, item.batch.batch["weight_version"], dict(item.counts))

    def publish(self, step: int, timer: StageTimer) -> None:
        with timer("publish"):
            weights = self._weights(step + 1)
            self.pipeline.publish(step + 1, weights)
            if self.remote_board is not None:  # after the pipeline knows it: versions only move forward
                self.remote_board.post(step + 1, weights)

    def staleness(self, rollout: Rollout, step: int) -> dict[str, float]:
        tokens, mask = token_versions(rollout.batch)
        out = staleness_metrics(rollout.versions, step, tokens, mask)
        if self.partial and tokens is not None:  # rows whose tokens span a swap
            live = mask.bool()
            newest = torch.where(live, tokens, torch.zeros_like(tokens)).max(-1).values
            oldest = torch.where(live, tokens, torch.full_like(tokens, 1 << 40)).min(-1).values
            out["async/swapped_rows_frac"] = ((newest > oldest) & live.any(-1)).float().mean().item()
        if out["async/staleness_max"] > self.max_staleness:  # the pipeline's gate makes this impossible
            raise RunError(
                f"sample staleness {out['async/staleness_max']:g} above the bound {self.max_staleness}"
            )
        return out

    def paused(self) -> threading.Lock:
        return self.gate

    def prompt_state(self) -> dict:
        """Where the trainer is in the prompt stream, however far ahead the thread has drawn."""
        return self.consumed if self.consumed is not None else self.prompts.state_dict()

    def save(self, checkpoint: Path, step: int) -> None:
        """An exact pipeline's next batch, generated with the weights before this step's update (a
        latest pipeline's depend on thread timing anyway: they are generated again); with carried
        partial rollouts, the prompts drawn but not yet trained (generated again first on resume)."""
        if self.carry is not None:
            save_carried(checkpoint, self.carried)
        if not self.exact or self.pipeline is None or step >= self.ctx.profile.trainer.steps:
            return
        item = self.pipeline.peek(step + 1)
        save_pending(checkpoint, [item] if item.version <= step else [])

    def load(self, checkpoint: Path | None) -> None:
        """The batches the checkpoint holds come first; the thread draws after their prompts."""
        self.ready = load_pending(checkpoint) if checkpoint is not None else []
        self.carried = load_carried(checkpoint) if checkpoint is not None else None
        if self.ready:
            consumed = self.prompts.state_dict()
            self.prompts.load_state_dict(self.ready[-1].data_state)
            self.consumed = consumed

    # -- the rollout thread's side -------------------------------------------------------------------
    def _produce(self, index: int, version: int) -> Produced:
        timer = StageTimer()
        sampler = self.group if self.carry is None else self.carry
        if self.carry is not None:
            self.carry.required = self.pipeline.required(index)
        with self.gate:
            batch, counts = self.stage(timer, index, sampler)
        versions, (tokens, mask) = batch.batch["weight_version"], token_versions(batch)
        sampled = None if tokens is None else tokens[mask.bool()]
        oldest = int(sampled.min()) if sampled is not None and sampled.numel() else int(versions.min())
        if oldest < self.pipeline.required(index):
            raise RunError(f"batch {index} has samples of version {oldest}, older than allowed")
        if self.partial:  # a swap left the workers on a newer version than the last push
            held = min(self.group.held_version())  # the oldest rank's: a push brings the rest up
            with self.pipeline.cond:
                self.pipeline.loaded = max(self.pipeline.loaded or 0, held)
        counts = {**counts, **self.push_checks}  # the checks of the weights it was generated with
        # the rollout workers' peak, read here between their calls (from the trainer's thread the
        # call would wait behind their next generation)
        counts.update(peak_memory_metrics({"rollout": self.group}))
        carried = None
        if self.carry is not None:
            counts.update(self.carry.metrics())
            carried = self.carry.untrained()
        state = self.prompts.state_dict()
        return Produced(index, batch, version, counts, dict(timer.seconds), state, carried)

    def _push(self, version: int, weights: LazyInput) -> None:
        """Load ``version`` into the rollout workers; each checks it (``sync/fingerprint_*``, and
        ``sync/canary_*`` where the canary is due)."""
        results = self.group.update_weights(weights, version)
        if any(r.get("sync/need_full") for r in results):  # a version gap: the last published, whole
            results = self.group.update_weights(self.ctx.policy.published_full(), version)
        self.push_checks = merge_push_metrics(results) | {
            k: results[0][k] for k in DELTA_KEYS if k in results[0]
        }

    def _weights(self, version: int) -> LazyInput:
        """The policy's current weights (version ``version``) as a stand-in the rollout workers
        resolve themselves: rank 0's host copy moves worker to worker (Ray's object store); the
        trainer does not wait."""
        future = self.ctx.policy.full_weights(version, blocking=False)
        if self.partial:
            self.futures = {v: f for v, f in self.futures.items() if v >= version - 1} | {version: future}
        return future.lazy(("item", 0))

    def _board(self, version: int) -> Any:
        """What the rollout workers poll between decode steps: this source in-process; on Ray a
        :class:`~rlctl.dispatch.version_board.RayVersionBoard` the driver posts each published
        version to (its weights a lazy input the workers fetch from the object store themselves)."""
        if self.ctx.profile.cluster.backend != "ray":
            return self
        self.remote_board = RayVersionBoard()
        self.remote_board.post(version, self.futures[version].lazy(("item", 0)))
        return self.remote_board

    def newer(self, than: int) -> tuple[int, Any] | None:
        """Partial rollouts' board (:class:`~rlctl.trainer.workers.inflight_swap.WeightBoard`):
        the newest published version and its weights if newer than ``than``; asked by the
        rollout workers between decode steps."""
        with self.pipeline.cond:
            newest = max(self.pipeline.published)
            future = self.futures.get(newest)
        if newest <= than or future is None:
            return None
        return newest, future.get()[0]

    def _carry(self) -> CarriedRollouts:
        """Carried partial rollouts over the rollout workers; a resume's untrained prompts first."""
        p = self.ctx.profile
        carry = CarriedRollouts(
            self.group,
            self.prompts.next_batch,
            n=p.rollout.n,
            max_new_tokens=p.rollout.max_new_tokens,
            stop_share=p.trainer.carry_stop_share,
            pad_token_id=int(self.ctx.sampling(validation=False)["pad_token_id"]),
        )
        if self.carried is not None:
            carry.add(self.carried)
        return carry

    def _check_rollout_log_probs(self) -> None:
        p = self.ctx.profile
        r = p.rollout
        gap = self.group.rollout_log_prob_gap(r.temperature, r.top_p, r.top_k)
        if gap:
            raise UserError(
                f"{p.source}: trainer.mode = {p.trainer.mode!r} corrects off-policy samples "
                f"with the rollout engine's log-probs under log_softmax(logits / T), but {gap}; use "
                "trainer.mode = 'sync' or change the sampling settings"
            )
