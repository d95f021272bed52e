"""KL estimators, KL-in-reward with fixed/adaptive controllers, and KL as a loss.

``kl_penalty(logprob, ref_logprob, kind)`` matches verl's: ``k1``/``kl`` = ``lp - ref``; ``abs``;
``k2``/``mse`` = ``0.5 (lp - ref)^2``; ``k3``/``low_var_kl`` = ``clamp(exp(d) - d - 1, -10, 10)`` with
``d = clamp(ref - lp, -20, 20)``. A ``+`` suffix (``k1+``, ``k3+``, ...) keeps the base estimator's
forward value and takes k2's gradient (straight-through), which is the unbiased KL gradient.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from rlctl.algorithms.aggregation import agg_loss
from rlctl.algorithms.masked import masked_mean
from rlctl.algorithms.registry import get_kl_estimator, register_kl_estimator
from rlctl.errors import UserError


@register_kl_estimator("k1")
@register_kl_estimator("kl")
def k1(logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
    return logprob - ref_logprob


@register_kl_estimator("abs")
def kl_abs(logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
    return (logprob - ref_logprob).abs()


@register_kl_estimator("k2")
@register_kl_estimator("mse")
def k2(logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
    return 0.5 * (logprob - ref_logprob).square()


@register_kl_estimator("k3")
@register_kl_estimator("low_var_kl")
def k3(logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
    d = torch.clamp(ref_logprob - logprob, min=-20, max=20)
    return torch.clamp(torch.exp(d) - d - 1, min=-10, max=10)


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kind: str = "kl") -> torch.Tensor:
    """Per-token KL estimate of ``kind`` (any registered name, optionally with a ``+`` suffix)."""
    straight_through = kind.endswith("+")
    base = kind[:-1] if straight_through else kind
    forward = get_kl_estimator(base)(logprob, ref_logprob)
    if not straight_through:
        return forward
    backward = 0.5 * (logprob - ref_logprob).square()
    return backward - backward.detach() + forward.detach()


class FixedKLController:
    """Constant KL coefficient ``value``."""

    def __init__(self, kl_coef: float) -> None:
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """No-op (kept for the controller interface)."""

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value = float(state["value"])


class AdaptiveKLController:
    """Ziegler et al. (2019) adaptive coefficient, verl's rule:
    ``err = clip(kl / target - 1, -0.2, 0.2)``; ``value *= 1 + err * n_steps / horizon``."""

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: float) -> None:
        if horizon <= 0:
            raise UserError(f"kl_ctrl.horizon = {horizon}: expected a positive number")
        if target_kl <= 0:
            raise UserError(f"kl_ctrl.target_kl = {target_kl}: expected a positive number")
        self.value = float(init_kl_coef)
        self.target = float(target_kl)
        self.horizon = float(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        err = float(np.clip(current_kl / self.target - 1, -0.2, 0.2))
        self.value *= 1 + err * n_steps / self.horizon

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value = float(state["value"])


def make_kl_controller(
    type: str = "fixed", kl_coef: float = 0.001, target_kl: float = 0.1, horizon: float = 10000
) -> FixedKLController | AdaptiveKLController:
    """verl's ``get_kl_controller`` from the ``algorithm.kl_ctrl`` fields."""
    if type == "fixed":
        return FixedKLController(kl_coef)
    if type == "adaptive":
        return AdaptiveKLController(kl_coef, target_kl, horizon)
    raise UserError(f"kl_ctrl.type = {type!r}: expected 'fixed' or 'adaptive'")


@torch.no_grad()
def apply_kl_penalty(
    token_level_scores: torch.Tensor,
    old_log_prob: torch.Tensor,
    ref_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    kl_ctrl: FixedKLController | AdaptiveKLController,
    kind: str = "kl",
) -> tuple[torch.Tensor, dict[str, float]]:
    """KL in the reward (verl's ``apply_kl_penalty``): ``rewards = scores - beta * kl * mask``.

    ``current_kl`` is the per-sequence masked mean averaged over the batch; the controller is then
    updated with ``n_steps = batch size``. Metrics report the coefficient used (before the update).
    """
    mask = response_mask.to(token_level_scores.dtype)
    kld = kl_penalty(old_log_prob, ref_log_prob, kind) * mask
    beta = kl_ctrl.value
    rewards = token_level_scores - beta * kld
    current_kl = masked_mean(kld, mask, dim=-1).mean(dim=0).item()
    kl_ctrl.update(current_kl=current_kl, n_steps=token_level_scores.shape[0])
    return rewards, {"reward_kl_penalty": current_kl, "reward_kl_penalty_coeff": beta}


def kl_loss(
    log_prob: torch.Tensor,
    ref_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    kind: str = "low_var_kl",
    loss_agg_mode: str = "token-mean",
    **agg: Any,
) -> tuple[torch.Tensor, dict[str, float]]:
    """KL as a loss term (verl's ``use_kl_loss``): ``agg_loss(kl_penalty(lp, ref, kind))``.

    ``agg`` takes ``agg_loss``'s micro-batch totals (``global_tokens``, ``global_seqs``, ...).
    """
    kld = kl_penalty(log_prob, ref_log_prob, kind)
    loss = agg_loss(kld, response_mask, loss_agg_mode, **agg)
    return loss, {"kl_loss": loss.detach().item()}
