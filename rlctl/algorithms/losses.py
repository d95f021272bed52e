"""Value loss, entropy bonus and the actor's total loss (verl's ``compute_value_loss`` and the
entropy/KL terms of its actor update)."""

from __future__ import annotations

from typing import Any

import torch

from rlctl.algorithms.aggregation import agg_loss
from rlctl.algorithms.masked import masked_mean


def value_loss(
    vpreds: torch.Tensor,
    returns: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float,
    loss_agg_mode: str = "token-mean",
    **agg: Any,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped value loss ``0.5 * agg(max((v - R)^2, (clip(v, old - c, old + c) - R)^2))``.

    Same numbers as verl; ``vf_clipfrac`` is the masked fraction where the clipped term is larger.
    """
    vclipped = torch.max(torch.min(vpreds, values + cliprange_value), values - cliprange_value)
    losses1 = (vpreds - returns) ** 2
    losses2 = (vclipped - returns) ** 2
    loss = 0.5 * agg_loss(torch.max(losses1, losses2), response_mask, loss_agg_mode, **agg)
    clipfrac = masked_mean(torch.gt(losses2, losses1).to(vpreds.dtype), response_mask)
    return loss, {"vf_clipfrac": clipfrac.item()}


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Categorical entropy per position, ``logsumexp(z) - sum(softmax(z) * z)`` (verl's formula)."""
    p = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - torch.sum(p * logits, dim=-1)


def entropy_loss(
    entropy: torch.Tensor, response_mask: torch.Tensor, loss_agg_mode: str = "token-mean", **agg: Any
) -> torch.Tensor:
    """Aggregated entropy of per-token ``entropy`` (the actor subtracts ``entropy_coeff`` times this)."""
    return agg_loss(entropy, response_mask, loss_agg_mode, **agg)


def actor_loss(
    pg_loss: torch.Tensor,
    entropy: torch.Tensor | None = None,
    entropy_coeff: float = 0.0,
    kl: torch.Tensor | None = None,
    kl_loss_coef: float = 0.0,
) -> torch.Tensor:
    """verl's actor objective: ``pg - entropy_coeff * entropy + kl_loss_coef * kl`` (aggregated terms)."""
    total = pg_loss
    if entropy is not None and entropy_coeff != 0:
        total = total - entropy_coeff * entropy
    if kl is not None and kl_loss_coef != 0:
        total = total + kl_loss_coef * kl
    return total
