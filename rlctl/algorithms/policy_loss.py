"""Policy losses with verl's 7-argument contract.

``fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode=None, config=None,
rollout_is_weights=None) -> (loss, metrics)``; ``metrics`` values are Python floats under the keys
``pg_clipfrac``, ``ppo_kl``, ``pg_clipfrac_lower`` (verl prefixes them with ``actor/``; the trainer
does that here). ``loss_agg_mode=None`` means ``config.loss_agg_mode``.

Numbers match verl's ``compute_policy_loss_{vanilla,gspo,cispo,gpg}`` given the same clip settings
and aggregation; the mini-batch totals for exact micro-batching travel in the config
(``PolicyLossConfig.with_batch``), like verl's ``config.global_batch_info``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from rlctl.algorithms.aggregation import LOSS_AGG_MODES, agg_loss
from rlctl.algorithms.masked import masked_mean
from rlctl.algorithms.registry import register_policy_loss
from rlctl.errors import UserError


@dataclass(frozen=True)
class PolicyLossConfig:
    """Knobs of the policy losses (verl's ``actor.clip_ratio*`` and ``loss_agg_mode``).

    ``clip_ratio_low``/``clip_ratio_high`` default to ``clip_ratio``; DAPO's clip-higher sets
    ``clip_ratio_high`` above ``clip_ratio_low`` (e.g. 0.2 / 0.28). ``clip_ratio_c`` is the dual-clip
    bound for negative advantages (must be > 1). ``global_tokens``/``global_seqs``/``dp_size``/
    ``norm_constant`` are forwarded to :func:`agg_loss`.
    """

    clip_ratio: float = 0.2
    clip_ratio_low: float | None = None
    clip_ratio_high: float | None = None
    clip_ratio_c: float = 3.0
    loss_agg_mode: str = "token-mean"
    global_tokens: float | None = None
    global_seqs: float | None = None
    dp_size: int = 1
    norm_constant: float | None = None

    def __post_init__(self) -> None:
        if not self.clip_ratio_c > 1.0:
            raise UserError(f"clip_ratio_c = {self.clip_ratio_c}: the dual-clip bound must be > 1.0")
        if self.loss_agg_mode not in LOSS_AGG_MODES:
            raise UserError(
                f"loss_agg_mode = {self.loss_agg_mode!r}: expected one of {', '.join(LOSS_AGG_MODES)}"
            )
        for name in ("clip_ratio", "clip_ratio_low", "clip_ratio_high"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise UserError(f"{name} = {value}: expected a non-negative number")

    @property
    def low(self) -> float:
        return self.clip_ratio if self.clip_ratio_low is None else self.clip_ratio_low

    @property
    def high(self) -> float:
        return self.clip_ratio if self.clip_ratio_high is None else self.clip_ratio_high

    def agg_kwargs(self) -> dict[str, Any]:
        return {
            "global_tokens": self.global_tokens,
            "global_seqs": self.global_seqs,
            "dp_size": self.dp_size,
            "norm_constant": self.norm_constant,
        }

    def with_batch(
        self, *, global_tokens: float | None, global_seqs: float | None, dp_size: int = 1
    ) -> PolicyLossConfig:
        """A copy carrying the mini-batch totals for one micro-batch call (see ``agg_loss``)."""
        return dataclasses.replace(
            self, global_tokens=global_tokens, global_seqs=global_seqs, dp_size=dp_size
        )


def _setup(config: PolicyLossConfig | None, loss_agg_mode: str | None) -> tuple[PolicyLossConfig, str]:
    config = PolicyLossConfig() if config is None else config
    return config, (config.loss_agg_mode if loss_agg_mode is None else loss_agg_mode)


@register_policy_loss("vanilla", advantage_linear=True)
def vanilla(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str | None = None,
    config: PolicyLossConfig | None = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clip: ``max(-A r, -A clip(r, 1-low, 1+high))``; where ``A < 0`` also capped at
    ``-A * clip_ratio_c`` (dual clip). ``r = exp(clamp(lp - old, -20, 20))``. Multiplied by
    ``rollout_is_weights`` when given, then aggregated. Same numbers as verl's ``vanilla``."""
    config, mode = _setup(config, loss_agg_mode)
    log_ratio = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(log_ratio)
    ppo_kl = masked_mean(-log_ratio, response_mask)

    losses1 = -advantages * ratio
    losses2 = -advantages * torch.clamp(ratio, 1 - config.low, 1 + config.high)
    clipped = torch.maximum(losses1, losses2)
    clipfrac = masked_mean(torch.gt(losses2, losses1).to(ratio.dtype), response_mask)

    losses3 = -advantages * config.clip_ratio_c
    dual = torch.minimum(losses3, clipped)
    clipfrac_lower = masked_mean(
        (torch.gt(clipped, losses3) & (advantages < 0)).to(ratio.dtype), response_mask
    )
    pg_losses = torch.where(advantages < 0, dual, clipped)
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    loss = agg_loss(pg_losses, response_mask, mode, **config.agg_kwargs())
    return loss, {
        "pg_clipfrac": clipfrac.item(),
        "ppo_kl": ppo_kl.item(),
        "pg_clipfrac_lower": clipfrac_lower.item(),
    }


@register_policy_loss("gspo", advantage_linear=True)
def gspo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str | None = None,
    config: PolicyLossConfig | None = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GSPO: sequence ratio ``s = exp(mean_t(lp - old))`` with a token-level straight-through
    (``log s_t = sg(log s) + lp - sg(lp)``, clamped at 10), PPO-clipped with low/high, no dual clip.

    Aggregation follows ``loss_agg_mode`` as in verl (the GSPO paper uses ``seq-mean-token-mean``).
    """
    config, mode = _setup(config, loss_agg_mode)
    log_ratio = log_prob - old_log_prob
    lengths = response_mask.sum(dim=-1).clamp(min=1)
    seq_log_ratio = (log_ratio * response_mask).sum(dim=-1) / lengths
    log_seq_ratio = log_prob - log_prob.detach() + seq_log_ratio.detach().unsqueeze(-1)
    seq_ratio = torch.exp(torch.clamp(log_seq_ratio, max=10.0))
    losses1 = -advantages * seq_ratio
    losses2 = -advantages * torch.clamp(seq_ratio, 1 - config.low, 1 + config.high)
    pg_losses = torch.maximum(losses1, losses2)
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    loss = agg_loss(pg_losses, response_mask, mode, **config.agg_kwargs())
    return loss, {
        "pg_clipfrac": masked_mean(torch.gt(losses2, losses1).to(seq_ratio.dtype), response_mask).item(),
        "ppo_kl": masked_mean(-log_ratio, response_mask).item(),
        "pg_clipfrac_lower": 0.0,
    }


@register_policy_loss("cispo", advantage_linear=True)
def cispo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str | None = None,
    config: PolicyLossConfig | None = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """CISPO: ``-sg(clip(r, 1-low, 1+high)) * A * log_prob``; the gradient flows through
    ``log_prob`` only, so clipped tokens still contribute (verl's ``cispo``)."""
    config, mode = _setup(config, loss_agg_mode)
    log_ratio = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(log_ratio)
    clipped = torch.clamp(ratio, 1 - config.low, 1 + config.high)
    pg_losses = -clipped.detach() * advantages * log_prob
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    loss = agg_loss(pg_losses, response_mask, mode, **config.agg_kwargs())
    return loss, {
        "pg_clipfrac": masked_mean((ratio != clipped).to(ratio.dtype), response_mask).item(),
        "ppo_kl": masked_mean(-log_ratio, response_mask).item(),
        "pg_clipfrac_lower": 0.0,
    }


@register_policy_loss("gpg", advantage_linear=True)
def gpg(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str | None = None,
    config: PolicyLossConfig | None = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GPG: plain policy gradient ``-log_prob * A`` (no ratio, no clip). verl returns no metrics;
    this also reports ``ppo_kl`` (zero clip fractions) so the trainer's keys are uniform."""
    config, mode = _setup(config, loss_agg_mode)
    pg_losses = -log_prob * advantages
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    loss = agg_loss(pg_losses, response_mask, mode, **config.agg_kwargs())
    ppo_kl = masked_mean(-(log_prob - old_log_prob).detach(), response_mask).item()
    return loss, {"pg_clipfrac": 0.0, "ppo_kl": ppo_kl, "pg_clipfrac_lower": 0.0}
