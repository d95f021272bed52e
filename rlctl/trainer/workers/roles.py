"""The SPMD programs of each role: one instance per rank, called through the dispatch runtime.

PolicyWorker holds the actor's training engine and the rollout engine in one process (the
colocated HybridEngine); ReferenceWorker and CriticWorker hold frozen / value models. Workers only
move tensors: the algorithm lives on the driver and in the loss closures of ``losses.py``.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from rlctl.algorithms.metric_parts import results
from rlctl.dispatch import DataProto, Dispatch, Worker, register
from rlctl.engines.batch_metrics import BatchMetrics
from rlctl.engines.numerics import model_shape, vocab_size_of
from rlctl.engines.registry import get_engine
from rlctl.errors import UserError
from rlctl.profile.schema import ActorSection, CriticSection, RefSection
from rlctl.trainer.plan.specs import CriticSpec, EngineSpec, PolicySpec, RefSpec, offloads
from rlctl.trainer.state.canary import SyncCanary, canary_due
from rlctl.trainer.state.fingerprint import SyncCheck, takes_salt, without
from rlctl.trainer.step.minibatch import MINI_BATCH_ROWS, split_mini_batches
from rlctl.trainer.step.stages import mean_metrics
from rlctl.trainer.workers.delta_push import DeltaPublisher, colocated_delta_sync, delta_ready, fail
from rlctl.trainer.workers.losses import make_actor_loss, make_critic_loss, zero_gradient_rows
from rlctl.trainer.workers.memory import PeakMemory
from rlctl.trainer.workers.planned_sync import planned_sync, stored_gib
from rlctl.trainer.workers.rollout_engines import _model_type, rollout_engine  # noqa: F401  (re-exported)
from rlctl.trainer.workers.sampling import _pad_responses, sample_rows  # noqa: F401  (re-exported)
from rlctl.trainer.workers.threads import _cpu_threads, split_cpu_threads  # noqa: F401  (re-exported)
from rlctl.trainer.workers.weight_streams import ByteCount, PublishedWeights, merged_stream, model_bytes

RoleSection = ActorSection | CriticSection | RefSection  # the section a role's micro-batches come from
SYNC_STATE = "sync.json"  # the actor's weight version, beside its checkpoint

TRAIN_KEYS = ("input_ids", "attention_mask", "position_ids", "responses", "response_mask")
FAULT_ENV = "RLCTL_INJECT_FAULT"  # "<method>@<step>[:rank]": raise there (tests of failure reporting)


def inject_fault(worker: Worker, method: str, step: int | None) -> None:
    """Raise in ``method`` at ``step`` when RLCTL_INJECT_FAULT asks for it (never set in normal runs)."""
    spec = os.environ.get(FAULT_ENV, "")
    if not spec or step is None:
        return
    where, _, rank = spec.partition(":")
    name, _, at = where.partition("@")
    if name == method and at.isdigit() and int(at) == step and (not rank or int(rank) == worker.rank):
        raise RuntimeError(f"injected fault in {method} at step {step} ({FAULT_ENV}={spec})")


def _train_engine(
    worker: Worker, spec: EngineSpec, section: RoleSection, actor: ActorSection, optim=None, **kw: Any
):
    """Initialise torch.distributed for this group if needed, then build an FSDP2 engine whose
    micro-batches are the role's ``section``'s (``micro_batch_sequences`` / ``_tokens``) and whose
    activation checkpointing and offload are the ``actor`` section's (every role takes the actor's)."""
    _cpu_threads(worker, spec)
    if worker.world_size > 1:
        worker.init_distributed(spec.dist_backend)
    torch.manual_seed(spec.seed)
    cls = get_engine("train", _model_type(spec.model_path), "fsdp2", spec.device_type)
    return cls(
        spec.model_path,
        device=spec.device_type,
        dtype=spec.dtype,
        mixed_precision=spec.mixed_precision,
        trust_remote_code=spec.trust_remote_code,
        value_head=kw.get("value_head", False),
        activation_checkpointing=actor.activation_checkpointing,
        cpu_offload=offloads(actor),
        attn_implementation=spec.attn_implementation,
        optim=optim,
        micro_batch_size=section.micro_batch_sequences,
        micro_batch_tokens=section.micro_batch_tokens,
        **({"lora": kw["lora"]} if kw.get("lora") is not None else {}),
    )


def _train_view(batch: DataProto, *extra: str) -> dict[str, torch.Tensor]:
    """The engine's tensors; rows marked as padding get an all-zero ``response_mask``, so they
    count in no loss, token or sequence total and no metric."""
    keys = [k for k in (*TRAIN_KEYS, *extra) if k in batch.batch]
    view = {k: batch.batch[k] for k in keys}
    pad = batch.padding_mask()
    if "response_mask" in view and bool(pad.any()):
        mask = view["response_mask"]
        view["response_mask"] = mask * (~pad).to(device=mask.device, dtype=mask.dtype)[:, None]
    return view


def _mini_batches(batch: DataProto, view: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
    """This rank's share cut into the optimiser steps the driver laid out (``trainer.minibatch``)."""
    return split_mini_batches(view, batch.meta.get(MINI_BATCH_ROWS))


class PolicyWorker(PeakMemory, Worker):
    """Actor (FSDP2 training engine) + rollout engine, colocated; weights move in memory."""

    def __init__(self, spec: PolicySpec) -> None:
        super().__init__()
        self.spec = spec

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        spec = self.spec
        self.actor = _train_engine(self, spec.engine, spec.loss.actor, spec.loss.actor, spec.optim, lora=spec.lora)
        self.rollout = rollout_engine(spec, actor=self.actor if self.world_size == 1 else None)
        self.actor_loss = make_actor_loss(spec.loss)
        if spec.rollout.section.delta_sync and not delta_ready(self.rollout):
            raise UserError(f"rollout.delta_sync = true: {type(self.rollout).__name__} takes full weights only")
        self.delta_base = False  # the rollout copy holds the last checked sync (delta syncs may start)
        self.sync_weights()

    @register(dispatch_mode=Dispatch.ROLLOUT_COMPUTE_PROTO)
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Sample one response per row (the driver repeats prompts n times beforehand).

        Split over the rollout replicas: under rollout tensor parallelism the TP ranks of a
        replica get the same rows and the replica's seed, and run one sharded model together.
        The engine seeds its own generator on its device from that integer seed and returns host
        tensors, so the driver never sees device memory.
        """
        out = sample_rows(self.rollout, prompts, self.mesh.rollout().dp_rank(self.rank))
        return DataProto.from_dict(tensors=out, meta={"weight_version": self._sync_check().version})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def generate_episodes(self, prompts: DataProto) -> DataProto:
        """Multi-turn rollout (:mod:`rlctl.agents`): one episode per row, the environment named in
        ``meta["agent"]`` running here, each turn sampled by this rank's rollout engine."""
        from rlctl.agents.batch import generate_episodes

        out = generate_episodes(
            self.rollout.generate, prompts, seed=int(prompts.meta["seed"]) * 1_000_003 + self.rank
        )
        out.meta["weight_version"] = self._sync_check().version
        return out

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_log_prob(self, batch: DataProto) -> DataProto:
        with self._actor_on_device():
            out = self.actor.compute_log_prob(
                _train_view(batch), temperature=float(batch.meta.get("temperature", 1.0)), with_entropy=True
            )
        return DataProto.from_dict(tensors={"old_log_probs": out["log_probs"], "entropy": out["entropy"]})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_ref_log_prob(self, batch: DataProto) -> DataProto:
        """The reference policy of a LoRA actor: the same model with its adapter off."""
        view = _train_view(batch)
        # the [ref] micro-batch keys, as a ref worker's
        sequences, tokens = self.spec.ref.micro_batch_sequences, self.spec.ref.micro_batch_tokens
        rows = max(1, tokens // max(1, view["input_ids"].shape[1])) if tokens > 0 else sequences
        with self._actor_on_device():
            out = self.actor.compute_base_log_prob(
                view, temperature=float(batch.meta.get("temperature", 1.0)), micro_batch_size=rows
            )
        return DataProto.from_dict(tensors={"ref_log_probs": out["log_probs"]})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_METRICS)
    def update_actor(self, batch: DataProto) -> dict[str, float]:
        """One RL step: ``ppo_epochs`` passes over the driver's mini-batches, then one LR step.

        The schedule counts RL steps, as verl does, so warmup and decay do not depend on how
        many mini-batches (optimiser steps) a step holds. The loss's metrics are the step's: its
        parts (:mod:`rlctl.engines.batch_metrics`) combined over every mini-batch and epoch.
        """
        inject_fault(self, "update_actor", batch.meta.get("step"))
        extra = ("old_log_probs", "ref_log_probs", "advantages", "rollout_is_weights", "rollout_log_probs")
        minis = _mini_batches(batch, _train_view(batch, *extra))
        metrics, parts = [], BatchMetrics()
        self.rollout.sleep()  # colocated: the rollout engine's memory goes to training until the sync
        with self._actor_on_device():
            for _ in range(self.spec.loss.actor.ppo_epochs):
                for mini in minis:
                    metrics.append(
                        self.actor.train_batch(
                            mini,
                            self.actor_loss,
                            temperature=self.spec.rollout.section.temperature,
                            step_schedule=False,
                            skip_rows=zero_gradient_rows(self.spec.loss, mini),
                        )
                    )
                    parts.add(getattr(self.actor, "metric_parts", {}))
            self.actor.advance_schedule()
        # the loss's namespaced metrics (rollout_corr/*, rollout/*) keep the names the driver uses
        merged = mean_metrics(metrics) | results(parts.reduce())
        if self.spec.lora is not None:
            merged |= self.actor.lora_metrics()
        return {k if "/" in k else f"actor/{k}": v for k, v in merged.items()}

    @register(dispatch_mode=Dispatch.RANK_ZERO)
    def rollout_log_prob_gap(self, temperature: float, top_p: float, top_k: int) -> str | None:
        """None when the rollout engine's log-probs equal ``log_softmax(logits / T)`` for these
        sampling settings; otherwise why not (rollout correction then cannot run)."""
        return self.rollout.log_prob_gap(temperature=temperature, top_p=top_p, top_k=top_k)

    @contextmanager
    def _actor_on_device(self) -> Iterator[None]:
        """With param/optimizer offload on, the actor lives on the host between its own stages."""
        if offloads(self.spec.loss.actor):
            self.actor.onload()
        try:
            yield
        finally:
            if offloads(self.spec.loss.actor):
                self.actor.offload()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def sync_weights(self, step: int | None = None, skip: str | None = None) -> dict[str, float]:
        """Training layout -> rollout layout in memory, one size-bounded bucket at a time, then
        the check that the rollout engine now holds the trainer's weights (:mod:`.fingerprint`).

        One rank: the parameters stream straight across. Several ranks: the planned reshard moves
        each rank's FSDP shards to where the rollout layout needs them: full HF tensors at rollout
        TP 1; at TP > 1 straight into the engine's own shards (layout ``hf_tp``, in place: no rank
        materialises a tensor it does not hold, extra memory within one bucket).
        ``step`` is the RL step whose update is being synced (None at start and after a load);
        ``skip`` leaves that tensor out (fault injection for tests: ``RLCTL_INJECT_SYNC_SKIP``).
        Returns the ``sync/*`` metrics; a tensor that differs, or a canary gap too wide, fails the sync.
        """
        self.rollout.wake()
        sent, checked, stats, delta = ByteCount(), None, {}, {}
        lora = getattr(getattr(self, "spec", None), "lora", None)  # bench reshard's worker has no spec
        if lora is not None and getattr(self.rollout, "adapter_sync", False):
            self.rollout.update_weights(sent(without(self.actor.export_adapter(), skip)))
        elif lora is not None:  # no adapter API in this engine: merged weights
            checked = {}
            salt = self._sync_check().next_salt(self.rollout)
            self.rollout.update_weights(sent(without(merged_stream(self.actor, lora, checked, salt), skip)))
        elif self.world_size == 1 and self.spec.rollout.section.delta_sync and self.delta_base:
            delta, bad = colocated_delta_sync(without(self.actor.export_weights("full"), skip), self.rollout)
            fail(bad, f"weight sync {self._sync_check().version + 1}", self.rank)
        elif self.world_size == 1:
            self.rollout.update_weights(sent(without(self.actor.export_weights("full"), skip)))
        else:
            planned_sync(self, skip, sent, stats)
        mesh = self.actor.mesh
        out = self._sync_check().after_sync(
            self.actor.model,
            self.rollout,
            device=self.actor.device,
            group=mesh.get_group() if mesh is not None else None,
            actor=self.actor,
            params=None if checked is None else list(checked.items()),
        )
        out["sync/bytes"] = float(sent.bytes)
        if getattr(self, "spec", None) is not None and self.spec.rollout.section.delta_sync:
            out.update(delta or {"sync/delta": 0.0})  # a full sync: at start, after a load
            self.delta_base = True
        if stats:  # what the planned move held beyond the two layouts (buffers + unfinished outputs)
            out["sync/peak_extra_bytes"] = float(stats["peak_extra_bytes"])
        if (stored := stored_gib(self.rollout)) is not None:  # the rollout weights this rank holds
            out["memory/rollout_weights_gib"] = stored
        if lora is not None:
            out["sync/model_bytes"] = float(model_bytes(self.actor.model))
        return out

    def _sync_check(self) -> SyncCheck:
        """This rank's sync checker (made on first use: it counts the syncs, the weight version)."""
        if getattr(self, "_sync_checker", None) is None:
            self._sync_checker = SyncCheck(rank=self.rank, canary=SyncCanary.of_worker(self))
        return self._sync_checker

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def full_weights(self, version: int | None = None) -> PublishedWeights | None:
        """The actor's full HF-named weights as host copies on rank 0 (None on other ranks; every
        rank gathers), for rollout workers in other processes (``trainer.mode`` one_step_off/async),
        with the trainer's canary scores for them where weight version ``version`` is due one
        (:func:`~rlctl.trainer.state.canary.canary_due`, asked of this worker's engine, the
        rollout workers' kind; every rank scores: collective under FSDP)."""
        canary = self._sync_check().canary
        if version is not None and not canary_due(version, self.rollout):
            canary = None
        with self._actor_on_device():  # a LoRA actor's rollout engines take the adapter alone
            if self.spec.lora is None:
                stream = self.actor.export_weights("full")
            elif getattr(self.rollout, "adapter_sync", False):
                stream = self.actor.export_adapter()
            else:
                stream = merged_stream(self.actor, self.spec.lora, {})
            if self.spec.rollout.section.delta_sync:  # rank 0 encodes; the others only join the gathers
                out = self._publish_delta(stream, version)
            else:
                out = PublishedWeights({name: t.detach().to("cpu", copy=True) for name, t in stream})
            if canary is not None:
                start = time.perf_counter()
                out.canary_tokens, out.canary_scores = canary.trainer_scores(self.actor)
                out.model_shape = model_shape(self.actor.model.config)
                out.canary_vocab = vocab_size_of(self.actor.model.config)
                out.canary_s = time.perf_counter() - start
        return out if self.rank == 0 else None

    def _publish_delta(self, stream, version: int | None) -> PublishedWeights:
        """Weight version ``version`` as the delta from the last one published (:mod:`.delta_push`)."""
        if self.rank != 0:
            for _ in stream:
                pass
            return PublishedWeights({})
        if getattr(self, "publisher", None) is None:
            self.publisher = DeltaPublisher(getattr(torch, self.spec.rollout.dtype))
        salt = version if version is not None and takes_salt(self.rollout) else 0
        full, deltas, base, samples = self.publisher.publish(stream, version or 0, salt)
        return PublishedWeights(full, deltas=deltas, base_version=base, samples=samples, version=version)

    @register(dispatch_mode=Dispatch.RANK_ZERO)
    def published_full(self) -> PublishedWeights:
        """The last published version whole, for a rollout worker that holds another one."""
        full, version = self.publisher.full()
        return PublishedWeights(full, version=version)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, path: str) -> None:
        self.actor.save_checkpoint(Path(path) / "actor")
        if self.rank == 0:  # the weight version goes on counting where the run stopped
            (Path(path) / "actor" / SYNC_STATE).write_text(
                json.dumps({"version": self._sync_check().version})
            )

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str) -> None:
        self.actor.load_checkpoint(Path(path) / "actor")
        self.delta_base = False  # the first sync after a load is full
        saved = Path(path) / "actor" / SYNC_STATE
        if saved.is_file():  # the sync below re-sends the saved version's weights: count it once
            self._sync_check().version = max(int(json.loads(saved.read_text())["version"]) - 1, 0)
        self.sync_weights()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def export_hf(self, path: str) -> None:
        self.actor.save_hf(path)


class ReferenceWorker(PeakMemory, Worker):
    """The frozen reference policy: log-probs only."""

    def __init__(self, spec: RefSpec) -> None:
        super().__init__()
        self.spec = spec

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        self.ref = _train_engine(self, self.spec.engine, self.spec.section, self.spec.actor)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_ref_log_prob(self, batch: DataProto) -> DataProto:
        out = self.ref.compute_log_prob(
            _train_view(batch), temperature=float(batch.meta.get("temperature", 1.0))
        )
        return DataProto.from_dict(tensors={"ref_log_probs": out["log_probs"]})


class CriticWorker(PeakMemory, Worker):
    """The value model of PPO: values and its own optimiser steps."""

    def __init__(self, spec: CriticSpec) -> None:
        super().__init__()
        self.spec = spec

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        self.critic = _train_engine(
            self, self.spec.engine, self.spec.section, self.spec.actor, optim=self.spec.optim, value_head=True
        )
        self.critic_loss = make_critic_loss(self.spec)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_values(self, batch: DataProto) -> DataProto:
        return DataProto.from_dict(tensors={"values": self.critic.compute_values(_train_view(batch))})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_METRICS)
    def update_critic(self, batch: DataProto) -> dict[str, float]:
        """One RL step of the value model, laid out and scheduled like ``update_actor``."""
        minis = _mini_batches(batch, _train_view(batch, "values", "returns"))
        metrics, parts = [], BatchMetrics()
        for _ in range(self.spec.section.ppo_epochs):
            for mini in minis:
                metrics.append(self.critic.train_batch(mini, self.critic_loss, step_schedule=False))
                parts.add(getattr(self.critic, "metric_parts", {}))
        self.critic.advance_schedule()
        return {f"critic/{k}": v for k, v in (mean_metrics(metrics) | results(parts.reduce())).items()}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, path: str) -> None:
        self.critic.save_checkpoint(Path(path) / "critic")

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str) -> None:
        self.critic.load_checkpoint(Path(path) / "critic")
