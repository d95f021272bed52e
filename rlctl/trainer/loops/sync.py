"""The driver loop, one for every ``trainer.mode``: one readable function per stage of an RL step.

Per step: the batch from the rollout source (prompts -> n responses -> rewards, made in the step
or ahead of it: :mod:`rlctl.trainer.loops.source`) -> old log-probs (training engine) -> reference
log-probs (when a KL term is on) -> values (PPO) -> advantages (driver) -> critic and actor updates
-> weight sync to the rollout engine, the new weights to the source -> metrics, validation,
checkpoint. Everything heavy runs inside the worker groups; only the batch crosses.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import replace
from pathlib import Path

from rlctl.agents.driver import EpisodeRollout, agent_metrics
from rlctl.algorithms.kl import make_kl_controller
from rlctl.dispatch import DataProto, WorkerError
from rlctl.errors import RunError
from rlctl.log import get_logger
from rlctl.profile import profile_to_dict
from rlctl.tracking import Tracker
from rlctl.tracking.run_files import atomic_dir, write_text_nofollow
from rlctl.trainer.loops.colocated import Colocated
from rlctl.trainer.loops.source import RolloutSource
from rlctl.trainer.loops.stop import StopSignals
from rlctl.trainer.plan.specs import effective_rollout_correction
from rlctl.trainer.setup.context import RunContext
from rlctl.trainer.state import checkpoint
from rlctl.trainer.state.fingerprint import (
    LogProbGapAlarm,
    merge_push_metrics,
    merge_sync_metrics,
    skipped_tensor,
)
from rlctl.trainer.state.samples import SampleLog
from rlctl.trainer.step.memory import peak_memory_metrics
from rlctl.trainer.step.minibatch import layout_mini_batches
from rlctl.trainer.step.stages import (
    StageTimer,
    batch_metrics,
    compute_advantages,
    for_workers,
    mean_metrics,
    trim_response_padding,
)

log = get_logger("rlctl.trainer")


class Trainer:
    """Runs ``profile.trainer.steps`` RL steps over the worker groups in ``ctx`` on ``source``'s batches."""

    def __init__(
        self,
        ctx: RunContext,
        *,
        max_steps: int | None = None,
        resume: checkpoint.ResumePlan | None = None,
        source: RolloutSource | None = None,
    ) -> None:
        self.ctx = ctx
        # the profile as run: off-policy modes always correct their samples (as the workers' loss spec)
        algo = replace(ctx.profile.algorithm, rollout_correction=effective_rollout_correction(ctx.profile))
        self.p = replace(ctx.profile, algorithm=algo)
        self.source = source if source is not None else Colocated(ctx)  # trainer.mode = "sync"
        self.total_steps = min(self.p.trainer.steps, max_steps or self.p.trainer.steps)
        self.resume = resume or checkpoint.ResumePlan(None, checkpoint.new_lineage())  # None: fresh
        self.lineage = checkpoint.new_lineage()  # replaced by _restore's plan
        self.step = 0  # the last completed step
        self.train_time_s = 0.0
        self.samples = SampleLog.off()  # fit() opens the run's samples.jsonl
        a = self.p.algorithm
        self.kl_ctrl = make_kl_controller(a.kl_ctrl, a.kl_coef, a.kl_target, a.kl_horizon)
        self.gap_alarm = LogProbGapAlarm(self.p.trainer.max_log_prob_gap)
        mini = self.p.actor.mini_batch_prompts or self.p.trainer.prompts_per_step
        self.mini_batch_prompts = mini
        # One epoch over one mini-batch without KL-in-reward: the update's own log-probs equal the
        # old ones, so the recompute pass is skipped (ratio == 1 by definition). A rollout correction
        # then takes them as the proximal policy's, inside the loss (``trainer.losses``).
        self.recompute_old_log_prob = (
            self.p.actor.ppo_epochs > 1
            or mini != self.p.trainer.prompts_per_step
            or self.p.algorithm.use_kl_in_reward
        )
        # Multi-turn mode (agent.env set): the rollout stage runs episodes, the environment scores them.
        self.episodes = EpisodeRollout(ctx) if getattr(self.p.agent, "episodic", False) else None

    # -- the loop ------------------------------------------------------------------------------------
    def fit(self) -> dict[str, float]:
        resumed_from = self._restore()
        self.source.load(resumed_from)
        self.tracker = Tracker(
            self.ctx.run_dir,
            self.p.trainer.loggers,
            self.p.run.name,
            profile_to_dict(self.p),
            self.total_steps,
            resume=resumed_from is not None,
            resume_step=self.step if resumed_from is not None else None,
            source=f"{self.p.source}: trainer.loggers",
        )
        self.samples = SampleLog.for_run(self.ctx, self.total_steps, self.step if resumed_from else None)
        try:
            return self._fit()
        finally:
            self.tracker.close()

    def _fit(self) -> dict[str, float]:
        last: dict[str, float] = {}
        with self.source.running(self.rollout, done=self.step, last=self.total_steps):
            if self.step == 0 and self.p.trainer.val_at_start:
                last = self.validate()
                if last:
                    self.tracker.log(last, step=0)
            with StopSignals(self.p.trainer.stop_grace_s) as stop:
                while self.step < self.total_steps:
                    try:
                        metrics = self.train_step(self.step + 1)
                    except WorkerError as exc:
                        raise self._record(exc.with_step(self.step + 1)) from exc
                    except RunError as exc:
                        raise self._record(RunError(f"step {self.step + 1}: {exc}")) from exc
                    self.step += 1
                    if self._due(self.p.trainer.val_every):
                        metrics.update(self.validate())
                    self.tracker.log(metrics, step=self.step)
                    last = metrics
                    if self._due(self.p.trainer.save_every) or stop.requested:
                        self.save()
                    if stop.requested:
                        raise stop.stopped(self.step)
            if self.p.trainer.export_hf:
                with atomic_dir(self.ctx.run_dir / "hf") as tmp:  # a full disk leaves no half export
                    self.ctx.policy.export_hf(str(tmp))
                    self.ctx.tokenizer.save_pretrained(str(tmp))
        return last

    def train_step(self, step: int) -> dict[str, float]:
        timer = StageTimer()
        start = time.perf_counter()
        rollout = self.source.next(step, timer)  # batch `step`, generated and scored, its versions
        batch, metrics = rollout.batch, dict(rollout.metrics)
        self.samples.training(batch, step)
        batch = trim_response_padding(batch)
        batch.meta["step"] = step
        if self.recompute_old_log_prob:
            with timer("old_log_prob"):
                batch = batch.union(self.ctx.policy.compute_log_prob(for_workers(batch)))
        if self.ctx.ref is not None:
            with timer("ref"):
                batch = batch.union(self.ctx.ref.compute_ref_log_prob(for_workers(batch)))
        if self.ctx.critic is not None:
            with timer("values"):
                batch = batch.union(self.ctx.critic.compute_values(for_workers(batch)))
        with timer("adv"):
            batch, adv_metrics = compute_advantages(batch, self.p.algorithm, self.kl_ctrl)
        if self.ctx.critic is not None:
            with timer("update_critic"):
                metrics.update(
                    mean_metrics(self.ctx.critic.update_critic(self._laid_out(batch, self.ctx.critic)))
                )
        with timer("update_actor"):
            metrics.update(mean_metrics(self.ctx.policy.update_actor(self._laid_out(batch, self.ctx.policy))))
        with timer("sync"):  # then the check that the rollout engine holds the new weights
            colocated_due = self.source.colocated or self._due(self.p.trainer.val_every, step)
            sync_metrics = self.sync_rollout(step) if colocated_due else {}
        groups = {"policy": self.ctx.policy, "ref": self.ctx.ref, "critic": self.ctx.critic}
        metrics.update(peak_memory_metrics(groups))  # a call per group: on the clock
        self.source.publish(step, timer)
        step_s = time.perf_counter() - start
        self.train_time_s += step_s
        tokens = float(batch.batch["attention_mask"].sum())
        metrics.update(adv_metrics)
        metrics.update(batch_metrics(batch, self.p.rollout.max_new_tokens, self.ctx.stop_ids))
        metrics.update(agent_metrics(batch.batch))
        # the rollout-vs-trainer log-prob gap alarm (``trainer.max_log_prob_gap``); a batch older
        # than the policy it trains has a gap that is mostly the policy's own move: async/ instead
        if int(rollout.lag(step).max()) > 0:
            for k in ("log_prob_diff_mean", "log_prob_diff_max"):
                if f"rollout/{k}" in metrics:
                    metrics[f"async/{k}"] = metrics.pop(f"rollout/{k}")
        self.gap_alarm.check(metrics, step)
        # the checks of the weights the batch was made with (a pipeline's pushes, in its metrics)
        # and of this step's sync (a mismatch already failed it) as one record, the worse
        metrics.update({**sync_metrics, **merge_push_metrics([sync_metrics, metrics])})
        metrics.update(timer.metrics())
        metrics.update(
            {"time/step": step_s, "train_time_s": self.train_time_s, "perf/tokens_per_s": tokens / step_s}
        )
        metrics.update(self.source.staleness(rollout, step))
        return metrics

    # -- stages ------------------------------------------------------------------------------------
    def rollout(self, timer: StageTimer, step: int, sampler=None) -> tuple[DataProto, dict[str, float]]:
        """Prompts -> n scored responses each, sampled on ``sampler`` (default: the policy's colocated
        engine); DAPO's dynamic sampling keeps only groups with signal (``step/dynamic_sampling``).
        Error/timeout counts add up over every scoring pass of the step (all rounds, ReMax's)."""
        from rlctl.trainer.step.dynamic_sampling import GroupRounds
        from rlctl.trainer.step.scoring import add_counts

        algo = self.p.algorithm
        groups = GroupRounds(algo, self.p.sequences_per_step, self.p.rollout.n)
        counts: dict[str, float] = {}
        for round_ in itertools.count(1):
            with timer("gen"):
                prompts = self.ctx.train_data.next_batch()
                batch = self.generate(
                    prompts, self.p.rollout.n, seed=self._seed(step, round_), sampler=sampler
                )
            with timer("reward"):
                batch, scored = self.score(batch)
                add_counts(counts, scored)
                if algo.adv_estimator == "remax":
                    batch, scored = self._remax_baseline(prompts, batch, step, sampler)
                    add_counts(counts, scored)
            if not algo.dynamic_sampling:
                return batch, counts
            if groups.add(batch):
                break
        if groups.refilled:
            message = "dynamic sampling ran out of rounds: refilled the batch with groups without signal"
            log.warning(message, step=step, **groups.refill_report())
        return groups.batch(), {**counts, **groups.metrics()}

    def generate(
        self,
        prompts: DataProto,
        n: int,
        *,
        seed: int,
        validation: bool = False,
        greedy: bool = False,
        sampler=None,
    ) -> DataProto:
        """n responses per prompt (rows of one prompt adjacent), with the prompt's columns carried,
        from ``sampler``'s ``generate_sequences`` (default: the policy's colocated engine).

        ``greedy`` forces argmax decoding whatever the sampling settings say. In multi-turn mode
        each row is an episode (:class:`~rlctl.agents.driver.EpisodeRollout`, colocated only).
        """
        if self.episodes is not None:
            return self.episodes.generate(prompts, n, seed=seed, validation=validation, greedy=greedy)
        rows = prompts.repeat(n, interleave=True)
        sampler = self.ctx.policy if sampler is None else sampler
        request = rows.select(["input_ids", "attention_mask"])  # with the prompts' columns
        # a sampler that hands back other rows than asked (carried partial rollouts) returns their columns
        returns_rows = getattr(sampler, "returns_rows", False)
        request.meta.update(self.ctx.sampling(validation=validation), seed=seed)
        if greedy:
            request.meta["greedy"] = True
        out = sampler.generate_sequences(request)
        return DataProto.from_dict(
            tensors=out.batch,
            non_tensors=out.non_tensor if returns_rows else rows.non_tensor,
            meta={
                "temperature": self.p.rollout.temperature,
                "weight_version": out.meta.get("weight_version"),
            },
        )

    def sync_rollout(self, step: int) -> dict[str, float]:
        """Step ``step``'s weights into the colocated rollout engine, checked (``sync/*`` metrics)."""
        return merge_sync_metrics(self.ctx.policy.sync_weights(step, skipped_tensor(step)))

    def score(self, batch: DataProto, *, shaping: bool = True) -> tuple[DataProto, dict[str, float]]:
        """The profile's reward on a generated batch; in multi-turn mode the environment's."""
        if self.episodes is not None:
            return self.episodes.score(batch, self.ctx.reward, shaping=shaping)
        return self.ctx.reward.score(batch, shaping=shaping)

    def _laid_out(self, batch: DataProto, group) -> DataProto:
        """The update's input: mini-batches of whole prompt groups, spread over ``group``'s DP ranks."""
        uids = batch.non_tensor.get("uid")
        return layout_mini_batches(for_workers(batch), uids, self.mini_batch_prompts, group.dp_size)

    def _remax_baseline(
        self, prompts: DataProto, batch: DataProto, step: int, sampler=None
    ) -> tuple[DataProto, dict[str, float]]:
        """ReMax's baseline: the reward of one greedy response per prompt (always greedy, as verl,
        whatever the validation sampling settings are), with that scoring pass's counts. The
        step's reward metrics stay those of the sampled responses."""
        out = self.generate(prompts, 1, seed=self._seed(step, 0), greedy=True, sampler=sampler)
        scored, counts = self.score(out)
        baseline = scored.batch["scores"].float().repeat_interleave(self.p.rollout.n)
        return batch.union(DataProto.from_dict(tensors={"reward_baselines": baseline})), counts

    def validate(self) -> dict[str, float]:
        """Greedy accuracy on the validation prompts (not counted in the training clock).

        Scored without training-time shaping: ``val/score_mean`` is the scorer's own mean score.
        Always on the policy's colocated engine, with the source paused (never both on the cores).
        """
        if self.ctx.val_prompts is None:
            return {}
        start = time.perf_counter()
        with self.source.paused():
            generated = self.generate(self.ctx.val_prompts, 1, seed=0, validation=True)
            try:
                batch, _ = self.score(generated, shaping=False)
            except RunError as exc:
                raise self._record(RunError(f"validation after step {self.step}: {exc}")) from exc
        out = {
            "val/score_mean": batch.batch["scores"].float().mean().item(),
            "time/val": time.perf_counter() - start,
        }
        if "acc" in batch.batch:
            out["val/accuracy"] = batch.batch["acc"].float().mean().item()
        out.update({f"val/{k.replace('/', '_')}": v for k, v in agent_metrics(batch.batch).items()})
        log.info("validation", step=self.step, **{k: round(v, 4) for k, v in out.items()})
        self.samples.validation(batch, self.step)
        return out

    # -- checkpoints ---------------------------------------------------------------------------------
    def save(self) -> None:
        """Driver state (world-size independent: one driver, one data stream, one schedule) plus
        each role's DCP shards, which load on any number of ranks."""
        state = {
            "step": self.step,
            "train_time_s": self.train_time_s,
            "data": self.source.prompt_state(),
            "kl_ctrl": self.kl_ctrl.state_dict(),
            "rng": checkpoint.rng_state(),
            "world_size": self.ctx.policy.world_size,
            "roles": self._checkpointed_roles(),
        }
        try:
            where = checkpoint.save_checkpoint(
                self.ctx.run_dir,
                self.step,
                state,
                self._write_parts,
                self.p.trainer.keep_checkpoints,
                self.lineage,
            )
        except WorkerError as exc:
            raise self._record(exc.with_step(self.step)) from exc
        except RunError as exc:
            raise self._record(exc) from exc
        log.info("checkpoint saved", step=self.step, path=str(where))

    def _write_parts(self, path: Path) -> None:
        """What the checkpoint holds beside the driver state: each role's shards, and what the
        source made ahead that a resume cannot make again."""
        self.ctx.policy.save_checkpoint(str(path))
        if self.ctx.critic is not None:
            self.ctx.critic.save_checkpoint(str(path))
        self.source.save(path, self.step)

    def _checkpointed_roles(self) -> list[str]:
        return ["policy"] + (["critic"] if self.ctx.critic is not None else [])

    def _restore(self) -> Path | None:
        """Continue from ``--resume``'s checkpoint (None: fresh start) on this run's world size."""
        plan = self.resume  # resolved once, before any worker started (checkpoint.prepare_resume)
        self.lineage = plan.lineage
        path = plan.path
        if path is None:
            return None
        state = checkpoint.load_driver_state(path)
        self.ctx.policy.load_checkpoint(str(path))
        if self.ctx.critic is not None:
            self.ctx.critic.load_checkpoint(str(path))
        self.step = state["step"]
        self.train_time_s = state["train_time_s"]
        self.ctx.train_data.load_state_dict(state["data"])
        self.kl_ctrl.load_state_dict(state["kl_ctrl"])
        checkpoint.set_rng_state(state["rng"])
        saved_world = state.get("world_size")
        if saved_world is not None and saved_world != self.ctx.policy.world_size:
            log.info("resharding the checkpoint", saved_ranks=saved_world, ranks=self.ctx.policy.world_size)
        log.info("resumed", step=self.step, path=str(path), lineage=self.lineage)
        return path

    # -- helpers ---------------------------------------------------------------------------------------
    def _record(self, exc: RunError) -> RunError:
        """Keep the full failure (remote traceback included) in RUN_DIR/error.log; return it to raise."""
        try:
            write_text_nofollow(self.ctx.run_dir / "error.log", f"{exc}\n")
        except OSError as err:  # a full disk must not hide the error that says so
            log.warning("could not write error.log", path=str(self.ctx.run_dir), error=str(err))
        return exc

    def _due(self, every: int, step: int | None = None) -> bool:
        """Whether something done every ``every`` steps (and after the last) follows ``step``
        (default: the last completed step)."""
        step = self.step if step is None else step
        return step == self.total_steps or (every > 0 and step % every == 0)

    def _seed(self, step: int, round_: int) -> int:
        return (self.p.run.seed * 1_000_003 + step * 101 + round_) % (2**31)
