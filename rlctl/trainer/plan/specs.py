"""What each worker role needs to build its engines, derived from the Profile on the driver.

Specs are small picklable dataclasses: the workers never see the Profile itself, so the same
worker code serves any front end.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from rlctl.engines.engine_specs import LoraSpec, OptimConfig
from rlctl.profile.schema import (
    ActorSection,
    AlgorithmSection,
    CriticSection,
    Profile,
    RefSection,
    RolloutSection,
)
from rlctl.trainer.plan.rollout_tp import rollout_rank_order


@dataclass(frozen=True)
class EngineSpec:
    """Where and how to load one model: what the run resolved (the model path, the device, the
    dtypes, attention, the backend), not the role's own keys. A role's micro-batches come from
    its own section (``ActorLossSpec.actor``, ``CriticSpec.section``, ``RefSpec.section``); its
    activation checkpointing and offload from the actor's section (:func:`offloads`)."""

    model_path: str
    device_type: str = "cpu"
    dtype: str = "float32"  # storage dtype of the parameters (fp32 master weights when training)
    mixed_precision: str | None = None  # compute dtype under FSDP2 mixed precision (None: as stored)
    attn_implementation: str = "sdpa"
    trust_remote_code: bool = False
    dist_backend: str = "gloo"
    seed: int = 1
    separate_rollout: bool = False  # a rollout group in processes of its own shares the hosts (off-policy)
    cpu_threads: int = 0  # platform.cpu_threads: 0 = auto (workers.roles._cpu_threads)


@dataclass(frozen=True)
class ActorLossSpec:
    """The actor objective (policy loss + entropy bonus + KL loss, ``workers.losses``): the
    profile's ``[actor]`` and ``[algorithm]`` sections as they are, and the two values the run
    derives from them."""

    actor: ActorSection = ActorSection()  # policy_loss, clip ratios, loss_agg_mode, entropy, KL loss
    algorithm: AlgorithmSection = AlgorithmSection()  # rollout_correction_mode / _threshold
    norm_constant: float | None = None  # seq-mean-token-sum-norm's divisor: rollout.max_new_tokens
    # the train/inference mismatch correction the loss computes when the driver did not (no
    # old-log-prob pass: the update's own detached log-probs are the proximal policy's); the
    # off-policy modes always correct (effective_rollout_correction)
    rollout_correction: str = "off"


@dataclass(frozen=True)
class RolloutSpec:
    """The rollout engine colocated with the actor: the profile's ``[rollout]`` section as it is
    (tensor_parallel, gpu_memory_utilization, delta_sync, temperature, ...) and what the run
    resolved from it for this host."""

    section: RolloutSection = RolloutSection()
    engine: str = "hf"  # rollout.engine made concrete (auto: the platform's choice)
    dtype: str = "float32"
    rank_order: str = "contiguous"  # TP groups over the policy's ranks (rlctl.reshard.choose_rank_order)
    vendor: str = "cpu"  # the platform: the engine registry is keyed by it
    # the engine's keywords: the platform's engine_settings(engine) under rollout.engine_kwargs
    engine_kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PolicySpec:
    """The actor and its colocated rollout engine. A step's update takes ``loss.actor.ppo_epochs``
    passes over the driver's mini-batches (cut the same for every world size by
    ``rlctl.trainer.step.minibatch``) at ``rollout.section.temperature``, then one LR-schedule step."""

    engine: EngineSpec
    optim: OptimConfig
    loss: ActorLossSpec
    rollout: RolloutSpec = RolloutSpec()
    lora: LoraSpec | None = None  # [actor.lora]: adapter training, adapter-only sync
    serves_reference: bool = False  # LoRA + KL: the reference is this model with the adapter off
    ref: RefSection = RefSection()  # [ref]: the micro-batches of those reference forwards


@dataclass(frozen=True)
class CriticSpec:
    """The value model: the profile's ``[critic]`` section as it is (clip range, epochs,
    micro-batches), its engine and optimiser, and the two values it takes from the actor."""

    engine: EngineSpec
    optim: OptimConfig
    section: CriticSection = CriticSection()  # clip range, epochs, micro-batches (path, lr: engine, optim)
    actor: ActorSection = ActorSection()  # [actor]: its activation_checkpointing and offload are the critic's
    loss_agg_mode: str = "token-mean"  # the actor's (actor.loss_agg_mode)
    norm_constant: float | None = None  # seq-mean-token-sum-norm divisor: the actor's (max_new_tokens)


@dataclass(frozen=True)
class RefSpec:
    """The frozen reference policy: its engine (``ref.path`` or ``model.path``, stored in the
    compute dtype) and the profile's ``[ref]`` section as it is (its micro-batches)."""

    engine: EngineSpec
    section: RefSection = RefSection()
    actor: ActorSection = ActorSection()  # [actor]: its activation_checkpointing and offload are the ref's


@dataclass(frozen=True)
class RoleSpecs:
    policy: PolicySpec
    ref: RefSpec | None = None
    critic: CriticSpec | None = None


def offloads(actor: ActorSection) -> bool:
    """Whether a training engine keeps its parameters (and optimiser state) on the host between
    its stages: ``actor.param_offload`` or ``actor.optimizer_offload``. The reference and the
    critic take the actor's setting, as they take its ``activation_checkpointing``."""
    return actor.param_offload or actor.optimizer_offload


def effective_rollout_correction(profile: Profile) -> str:
    """``algorithm.rollout_correction``, except that the off-policy modes always correct (token
    level when the profile says "off"): their samples come from older weights."""
    correction = profile.algorithm.rollout_correction
    if profile.trainer.mode != "sync" and correction == "off":
        return "token"
    return correction


def lora_spec(profile: Profile) -> LoraSpec | None:
    """``[actor.lora]`` as the engines' spec (the adapter's initial values seeded by ``run.seed``)."""
    lo = profile.actor.lora
    if lo is None:
        return None
    return LoraSpec(
        rank=lo.rank,
        alpha=lo.alpha,
        dropout=lo.dropout,
        target_modules=tuple(lo.target_modules),
        modules_to_save=tuple(lo.modules_to_save),
        export_merged=lo.export_merged,
        seed=profile.run.seed,
    )


def build_specs(
    profile: Profile,
    *,
    device_type: str,
    dtype: str,
    attn: str,
    dist_backend: str,
    rollout_engine: str = "hf",
    vendor: str = "cpu",
    rollout_engine_kwargs: dict[str, Any] | None = None,
) -> RoleSpecs:
    """Translate the profile's flat sections into the specs each role's worker receives.

    Each role reads its micro-batches from its own section; the reference and the critic take
    the actor's ``activation_checkpointing`` and offload (their specs hold ``[actor]`` for it).

    ``dtype`` is the compute dtype. Trained models (actor, critic) keep fp32 master weights and
    optimizer state and compute in ``dtype`` through FSDP2 mixed precision; the frozen reference
    and the rollout engine store their weights in ``dtype`` directly. The HF rollout engine takes
    ``attn`` as its one keyword; vLLM / SGLang take ``rollout_engine_kwargs`` (already checked).
    """
    p = profile
    low_precision = dtype != "float32"
    base = EngineSpec(
        model_path=p.model.path,
        device_type=device_type,
        dtype="float32",
        mixed_precision=dtype if low_precision else None,
        attn_implementation=attn,
        trust_remote_code=p.model.trust_remote_code,
        dist_backend=dist_backend,
        seed=p.run.seed,
        separate_rollout=p.trainer.mode != "sync",
        cpu_threads=p.platform.cpu_threads,
    )
    policy = PolicySpec(
        engine=base,
        optim=OptimConfig(
            lr=p.actor.lr,
            weight_decay=p.actor.weight_decay,
            warmup_steps=p.actor.warmup_steps,
            # the schedule counts RL steps (one per update call), as verl does
            total_steps=p.trainer.steps,
            schedule=p.actor.lr_schedule,
            grad_clip=p.actor.grad_clip,
        ),
        loss=ActorLossSpec(
            p.actor, p.algorithm, float(p.rollout.max_new_tokens), effective_rollout_correction(p)
        ),
        rollout=RolloutSpec(
            section=p.rollout,
            engine=rollout_engine,
            dtype=dtype,
            rank_order=rollout_rank_order(p)[0],
            vendor=vendor,
            engine_kwargs={"attn_implementation": attn}
            if rollout_engine == "hf"
            else dict(rollout_engine_kwargs or {}),
        ),
        lora=lora_spec(p),
        serves_reference=p.actor.lora is not None and profile.uses_reference,
        ref=p.ref,
    )
    ref = None
    if profile.uses_reference and not policy.serves_reference:
        ref = RefSpec(
            engine=replace(
                base,
                model_path=p.ref.path or p.model.path,
                dtype=dtype,
                mixed_precision=None,
            ),
            section=p.ref,
            actor=p.actor,
        )
    critic = None
    if profile.uses_critic:
        critic = CriticSpec(
            engine=replace(
                base,
                model_path=p.critic.path or p.model.path,
            ),
            optim=OptimConfig(
                lr=p.critic.lr,
                warmup_steps=p.critic.warmup_steps,
                total_steps=p.trainer.steps,
                grad_clip=p.critic.grad_clip,
                weight_decay=0.0,
            ),
            section=p.critic,
            actor=p.actor,
            loss_agg_mode=p.actor.loss_agg_mode,
            norm_constant=float(p.rollout.max_new_tokens),
        )
    return RoleSpecs(policy=policy, ref=ref, critic=critic)


def moved_model(spec: Any, old: str, new: str) -> Any:
    """``spec`` (a role's spec, or None) with its engine's ``model_path`` ``new`` where it was ``old``."""
    engine = getattr(spec, "engine", None)
    if not isinstance(engine, EngineSpec) or engine.model_path != old:
        return spec
    return replace(spec, engine=replace(engine, model_path=new))
