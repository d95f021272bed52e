"""What each worker role needs to build its engines, derived from the Profile on the driver.

Specs are small picklable dataclasses: the workers never see the Profile itself, so the same
worker code serves any front end.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from rlctl.engines.optim import OptimConfig
from rlctl.profile.schema import Profile


@dataclass(frozen=True)
class EngineSpec:
    """Where and how to load one model."""

    model_path: str
    device_type: str = "cpu"
    dtype: str = "float32"
    attn_implementation: str = "sdpa"
    trust_remote_code: bool = False
    dist_backend: str = "gloo"
    micro_batch_sequences: int = 16
    activation_checkpointing: bool = False
    offload: bool = False
    seed: int = 1


@dataclass(frozen=True)
class ActorLossSpec:
    """Knobs of the actor objective (policy loss + entropy bonus + KL loss)."""

    policy_loss: str = "vanilla"
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    clip_ratio_c: float = 3.0
    loss_agg_mode: str = "token-mean"
    entropy_coeff: float = 0.0
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.001
    kl_loss_type: str = "low_var_kl"
    norm_constant: float | None = None


@dataclass(frozen=True)
class UpdateSpec:
    """How one step's batch is cut into optimiser steps."""

    ppo_epochs: int = 1
    mini_batches: int = 1
    temperature: float = 1.0
    shuffle_seed: int = 1


@dataclass(frozen=True)
class PolicySpec:
    engine: EngineSpec
    optim: OptimConfig
    loss: ActorLossSpec
    update: UpdateSpec
    rollout_engine: str = "hf"


@dataclass(frozen=True)
class CriticSpec:
    engine: EngineSpec
    optim: OptimConfig
    update: UpdateSpec
    cliprange_value: float = 0.5
    loss_agg_mode: str = "token-mean"


@dataclass(frozen=True)
class RefSpec:
    engine: EngineSpec


@dataclass(frozen=True)
class RoleSpecs:
    policy: PolicySpec
    ref: RefSpec | None = None
    critic: CriticSpec | None = None


def build_specs(profile: Profile, *, device_type: str, dtype: str, attn: str, dist_backend: str) -> RoleSpecs:
    """Translate the profile's flat sections into the specs each role's worker receives."""
    p = profile
    base = EngineSpec(
        model_path=p.model.path,
        device_type=device_type,
        dtype=dtype,
        attn_implementation=attn,
        trust_remote_code=p.model.trust_remote_code,
        dist_backend=dist_backend,
        micro_batch_sequences=p.actor.micro_batch_sequences,
        activation_checkpointing=p.actor.activation_checkpointing,
        offload=p.actor.param_offload or p.actor.optimizer_offload,
        seed=p.run.seed,
    )
    mini = p.actor.mini_batch_prompts or p.trainer.prompts_per_step
    update = UpdateSpec(
        ppo_epochs=p.actor.ppo_epochs,
        mini_batches=p.trainer.prompts_per_step // mini,
        temperature=p.rollout.temperature,
        shuffle_seed=p.run.seed,
    )
    policy = PolicySpec(
        engine=base,
        optim=OptimConfig(
            lr=p.actor.lr,
            weight_decay=p.actor.weight_decay,
            warmup_steps=p.actor.warmup_steps,
            total_steps=p.trainer.steps * p.actor.ppo_epochs * update.mini_batches,
            schedule=p.actor.lr_schedule,
            grad_clip=p.actor.grad_clip,
        ),
        loss=ActorLossSpec(
            policy_loss=p.actor.policy_loss,
            clip_ratio_low=p.actor.clip_ratio_low,
            clip_ratio_high=p.actor.clip_ratio_high,
            clip_ratio_c=p.actor.clip_ratio_c,
            loss_agg_mode=p.actor.loss_agg_mode,
            entropy_coeff=p.actor.entropy_coeff,
            use_kl_loss=p.actor.use_kl_loss,
            kl_loss_coef=p.actor.kl_loss_coef,
            kl_loss_type=p.actor.kl_loss_type,
            norm_constant=float(p.rollout.max_new_tokens),
        ),
        update=update,
        rollout_engine="hf" if p.rollout.engine == "auto" else p.rollout.engine,
    )
    ref = None
    if profile.uses_reference:
        ref = RefSpec(
            engine=replace(
                base, model_path=p.ref.path or p.model.path, micro_batch_sequences=p.ref.micro_batch_sequences
            )
        )
    critic = None
    if profile.uses_critic:
        critic = CriticSpec(
            engine=replace(
                base,
                model_path=p.critic.path or p.model.path,
                micro_batch_sequences=p.critic.micro_batch_sequences,
            ),
            optim=OptimConfig(
                lr=p.critic.lr,
                warmup_steps=p.critic.warmup_steps,
                grad_clip=p.critic.grad_clip,
                weight_decay=0.0,
            ),
            update=UpdateSpec(
                ppo_epochs=p.critic.ppo_epochs,
                mini_batches=update.mini_batches,
                temperature=1.0,
                shuffle_seed=p.run.seed,
            ),
            cliprange_value=p.critic.cliprange_value,
            loss_agg_mode=p.actor.loss_agg_mode,
        )
    return RoleSpecs(policy=policy, ref=ref, critic=critic)
