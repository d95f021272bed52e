"""Loss closures handed to the training engine: the actor objective and the critic's value loss.

Each closure returns one micro-batch's exact share of the mini-batch loss (``LossScale`` carries
the mini-batch totals), so gradients do not depend on the micro-batch size, and its metrics as
parts, which the engine combines into the mini-batch's values (a registered policy loss's float
metrics are read as token means of the micro-batch, as verl's are).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rlctl.algorithms import (
    PolicyLossConfig,
    actor_loss,
    entropy_loss,
    get_policy_loss,
    is_advantage_linear,
    kl_loss,
    kl_penalty,
    value_loss,
)
from rlctl.algorithms.metric_parts import Mean, MetricPart, max_of, mean_of
from rlctl.algorithms.rollout_correction import rollout_is_weights_and_parts
from rlctl.engines.optim import LossScale
from rlctl.trainer.plan.specs import ActorLossSpec, CriticSpec

Batch = dict[str, torch.Tensor]
CORRECTION_PREFIX = "rollout_corr/"  # the correction's metrics keep the driver's names
Metrics = dict[str, MetricPart]
LossFn = Callable[[Batch, Batch, LossScale], tuple[torch.Tensor, Metrics]]


def _agg(scale: LossScale, norm_constant: float | None) -> dict:
    return {
        "global_tokens": scale.global_tokens,
        "global_seqs": scale.global_seqs,
        "dp_size": scale.dp_size,
        "norm_constant": norm_constant,
    }


def _token_means(metrics: dict[str, float], mask: torch.Tensor) -> dict[str, Mean]:
    """A loss's float metrics, token means of this micro-batch (verl's masked means), as parts."""
    tokens = float(mask.sum())
    return {k: Mean(float(v) * tokens, tokens) for k, v in metrics.items()}


def _loss_part(share: torch.Tensor, mask: torch.Tensor, mode: str, scale: LossScale) -> Mean:
    """This micro-batch's share of the mini-batch loss as parts whose combination over every
    micro-batch and rank is the mini-batch's loss: weighted by tokens (token-mean) or by
    sequences (the seq-mean modes), the weights ``agg_loss`` divides by."""
    if mode == "token-mean":
        local, total = float(mask.sum()), scale.global_tokens
    else:
        local, total = float((mask.sum(-1) > 0).sum()), scale.global_seqs
    return Mean(float(share) / scale.dp_size * total, local)


def make_actor_loss(spec: ActorLossSpec) -> LossFn:
    """Policy-gradient loss - entropy bonus + KL loss, as configured.

    Its metrics are parts (:mod:`rlctl.algorithms.metric_parts`): the engine reports the
    mini-batch's values, token-weighted (``rollout_corr/*`` of sequence level: per sequence),
    over all micro-batches and ranks, with true maxima and minima.
    """
    a, algo = spec.actor, spec.algorithm  # the profile's [actor] and [algorithm] sections
    policy_loss = get_policy_loss(a.policy_loss)
    base = PolicyLossConfig(
        clip_ratio_low=a.clip_ratio_low,
        clip_ratio_high=a.clip_ratio_high,
        clip_ratio_c=a.clip_ratio_c,
        loss_agg_mode=a.loss_agg_mode,
        norm_constant=spec.norm_constant,
    )

    def correction(old: torch.Tensor, mb: Batch) -> tuple[torch.Tensor | None, Metrics]:
        """The driver's importance weights, or (no old-log-prob pass) this micro-batch's from the
        proximal log-probs ``old`` and the rollout engine's; their metrics as ``rollout_corr/*``."""
        if "rollout_is_weights" in mb or spec.rollout_correction == "off" or "rollout_log_probs" not in mb:
            return mb.get("rollout_is_weights"), {}
        weights, parts = rollout_is_weights_and_parts(
            old,
            mb["rollout_log_probs"],
            mb["response_mask"],
            level=spec.rollout_correction,
            mode=algo.rollout_correction_mode,
            threshold=algo.rollout_correction_threshold,
        )
        return weights, {f"{CORRECTION_PREFIX}{k}": v for k, v in parts.items()}

    def loss_fn(out: Batch, mb: Batch, scale: LossScale) -> tuple[torch.Tensor, Metrics]:
        mask = mb["response_mask"]
        log_prob = out["log_probs"]
        # On-policy single update: the old policy is the current one, so use its detached log-probs.
        old = mb["old_log_probs"] if "old_log_probs" in mb else log_prob.detach()
        config = base.with_batch(
            global_tokens=scale.global_tokens, global_seqs=scale.global_seqs, dp_size=scale.dp_size
        )
        weights, corr_metrics = correction(old, mb)
        pg, pg_metrics = policy_loss(
            old, log_prob, mb["advantages"], mask, a.loss_agg_mode, config, weights
        )
        metrics: Metrics = {**_token_means(pg_metrics, mask), **corr_metrics}
        if "old_log_probs" not in mb and "rollout_log_probs" in mb:
            # no recompute pass measured the train/inference gap: the update's own log-probs do
            # (watched by the trainer's LogProbGapAlarm, on the mini-batch's true mean)
            gap = (old - mb["rollout_log_probs"]).abs()
            metrics["rollout/log_prob_diff_mean"] = mean_of(gap, mask)
            metrics["rollout/log_prob_diff_max"] = max_of(gap, mask)
        agg = _agg(scale, spec.norm_constant)
        ent = entropy_loss(out["entropy"], mask, a.loss_agg_mode, **agg) if "entropy" in out else None
        kl = None
        if a.use_kl_loss:
            kl, _ = kl_loss(log_prob, mb["ref_log_probs"], mask, a.kl_loss_type, a.loss_agg_mode, **agg)
            metrics["kl_loss"] = mean_of(
                kl_penalty(log_prob.detach(), mb["ref_log_probs"], a.kl_loss_type), mask
            )
        total = actor_loss(pg, ent, a.entropy_coeff, kl, a.kl_loss_coef)
        with torch.no_grad():  # the policy loss without importance weights, as reported before
            share, _ = policy_loss(old, log_prob, mb["advantages"], mask, a.loss_agg_mode, config)
        metrics["pg_loss"] = _loss_part(share, mask, a.loss_agg_mode, scale)
        if "entropy" in out:
            metrics["entropy"] = mean_of(out["entropy"], mask)
        return total, metrics

    return loss_fn


def zero_gradient_rows(spec: ActorLossSpec, mb: Batch) -> torch.Tensor | None:
    """Rows of ``mb`` that add nothing to the actor loss's gradient, for the engine to skip
    (``actor.skip_zero_advantage``): no loss tokens, or an advantage of exactly 0 at every token
    (a GRPO/RLOO group whose responses all scored the same) where the policy loss was registered
    as advantage-linear (``register_policy_loss(..., advantage_linear=True)``: the built-ins
    vanilla/dual-clip, gspo, cispo, gpg; never decided by its name) and there is no entropy bonus
    and no KL loss. None where nothing may be skipped."""
    if not (
        spec.actor.skip_zero_advantage
        and is_advantage_linear(spec.actor.policy_loss)
        and spec.actor.entropy_coeff == 0
        and not spec.actor.use_kl_loss
    ):
        return None
    live = mb["response_mask"].bool()
    return ~(live & (mb["advantages"] != 0)).any(-1)


def make_critic_loss(spec: CriticSpec) -> LossFn:
    """Clipped value loss against the returns computed on the driver.

    ``seq-mean-token-sum-norm`` divides by ``spec.norm_constant`` (the actor's, max_new_tokens),
    never by the batch's trimmed response width, which changes from step to step.
    """

    def loss_fn(out: Batch, mb: Batch, scale: LossScale) -> tuple[torch.Tensor, Metrics]:
        mask = mb["response_mask"]
        loss, floats = value_loss(
            out["values"],
            mb["returns"],
            mb["values"],
            mask,
            spec.cliprange_value,
            spec.loss_agg_mode,
            **_agg(scale, spec.norm_constant),
        )
        metrics: Metrics = dict(_token_means(floats, mask))
        metrics["vpred_mean"] = mean_of(out["values"], mask)
        metrics["vf_loss"] = mean_of(0.5 * (out["values"].detach() - mb["returns"]) ** 2, mask)
        return loss, metrics

    return loss_fn
