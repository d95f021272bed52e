"""Advantage estimators under verl's names and keyword arguments.

Each returns ``(advantages, returns)``, both ``(batch, response_len)``, computed without grad.
Every estimator accepts ``**kwargs`` so the driver can pass one uniform bag of fields
(``token_level_rewards``, ``response_mask``, ``index``, ``values``, ``reward_baselines``,
``gamma``, ``lam``, ``config``, ...) whatever the estimator.

Numbers match ``verl.trainer.ppo.core_algos`` (0.9.x) for the same inputs: unbiased (Bessel)
group std, ``std + epsilon`` in the denominator, a group of one gets mean 0 / std 1, whitening
via ``masked_whiten`` (eps inside the rsqrt). Group statistics are vectorised (``index_add``)
instead of verl's Python loop over samples, in float64; the results agree to float rounding,
except that a group of equal scores gets an advantage of exactly 0 (:func:`group_stats`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from rlctl.algorithms.masked import masked_whiten
from rlctl.algorithms.registry import register_adv_estimator


def _cfg(config: Any, name: str, value: Any, default: Any) -> Any:
    """Explicit argument, else ``config.name`` (attribute or mapping), else ``default``."""
    if value is not None:
        return value
    if config is not None:
        got = config.get(name) if isinstance(config, dict) else getattr(config, name, None)
        if got is not None:
            return got
    return default


def group_ids(index: Any, batch: int) -> tuple[torch.Tensor, int]:
    """Map group labels (numpy objects/strings/ints, a list, or a tensor) to dense ids 0..G-1.

    Ids follow first appearance, so the result does not depend on whether labels sort.
    """
    if index is None:
        raise ValueError("this estimator needs `index` (one group label per sample)")
    labels = index.tolist() if isinstance(index, torch.Tensor | np.ndarray) else list(index)
    if len(labels) != batch:
        raise ValueError(f"index has {len(labels)} labels for a batch of {batch}")
    table: dict[Any, int] = {}
    ids = [table.setdefault(lab, len(table)) for lab in labels]
    return torch.tensor(ids, dtype=torch.long), len(table)


def group_stats(scores: torch.Tensor, index: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-sample (group mean, unbiased group std, group size), verl's conventions, in ``scores``'
    dtype.

    A group of one gets mean 0 and std 1 (verl's choice: its advantage is its raw score).
    Deliberate difference from verl: the sums run in float64, and a group whose scores are all
    equal gets that score as its mean *exactly* and std 0, so ``score - mean`` is exactly 0 (verl's
    float32 mean of sixteen 0.7s is off by one rounding step, which its ``std + epsilon`` divisor
    then blows up to advantages of 0.056; such rows also escape ``actor.skip_zero_advantage``).
    """
    gid, n_groups = group_ids(index, scores.shape[0])
    gid = gid.to(scores.device)
    x = scores.double()
    count = torch.zeros(n_groups, dtype=torch.float64, device=scores.device).index_add_(
        0, gid, torch.ones_like(x)
    )
    total = torch.zeros_like(count).index_add_(0, gid, x)
    mean = total / count
    sq = torch.zeros_like(count).index_add_(0, gid, (x - mean[gid]) ** 2)
    std = torch.sqrt(sq / (count - 1).clamp(min=1))
    high = torch.full_like(count, -math.inf).scatter_reduce_(0, gid, x, "amax")
    low = torch.full_like(count, math.inf).scatter_reduce_(0, gid, x, "amin")
    equal = high == low  # every score of the group the same: exact mean, no spread
    mean = torch.where(equal, high, mean)
    std = torch.where(equal, torch.zeros_like(std), std)
    single = count == 1
    mean = torch.where(single, torch.zeros_like(mean), mean)
    std = torch.where(single, torch.ones_like(std), std)
    dtype = scores.dtype
    return mean[gid].to(dtype), std[gid].to(dtype), count[gid].to(dtype)


def _outcome(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    scores = token_level_rewards.sum(dim=-1)
    return scores, response_mask.to(scores.dtype)


@register_adv_estimator("gae")
@torch.no_grad()
def gae(
    token_level_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float | None = None,
    lam: float | None = None,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE (verl ``compute_gae_advantage_return``): reverse scan that carries value and GAE state
    across masked tokens; ``returns = adv + values`` before whitening; advantages whitened over the
    mask (raises, like verl, when the batch has fewer than two valid tokens)."""
    gamma = _cfg(config, "gamma", gamma, 1.0)
    lam = _cfg(config, "lam", lam, 1.0)
    mask = response_mask.to(values.dtype)
    next_value = torch.zeros_like(values[:, 0])
    last_gae = torch.zeros_like(values[:, 0])
    out = []
    for t in reversed(range(token_level_rewards.shape[-1])):
        delta = token_level_rewards[:, t] + gamma * next_value - values[:, t]
        new_gae = delta + gamma * lam * last_gae
        next_value = values[:, t] * mask[:, t] + (1 - mask[:, t]) * next_value
        last_gae = new_gae * mask[:, t] + (1 - mask[:, t]) * last_gae
        out.append(last_gae)
    advantages = torch.stack(out[::-1], dim=1)
    returns = advantages + values
    return masked_whiten(advantages, mask), returns


@register_adv_estimator("grpo")
@torch.no_grad()
def grpo(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any = None,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool | None = None,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO: ``(score - group_mean) / (group_std_unbiased + epsilon)``, broadcast over the mask.

    ``norm_adv_by_std_in_grpo=False`` is Dr.GRPO (mean baseline only). All-equal rewards give 0;
    a group of one keeps its raw score (mean 0, std 1), exactly as verl.
    """
    norm = _cfg(config, "norm_adv_by_std_in_grpo", norm_adv_by_std_in_grpo, True)
    scores, mask = _outcome(token_level_rewards, response_mask)
    mean, std, _ = group_stats(scores, index)
    adv = (scores - mean) / (std + epsilon) if norm else scores - mean
    adv = adv.unsqueeze(-1) * mask
    return adv, adv


@register_adv_estimator("rloo")
@torch.no_grad()
def rloo(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: Any = None, **kwargs: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO: ``(score - group_mean) * n / (n - 1)`` (= score minus the mean of the others).

    A group of one keeps its raw score, as verl's ``rloo`` does (its ``rloo_vectorized`` zeroes it).
    """
    scores, mask = _outcome(token_level_rewards, response_mask)
    mean, _, n = group_stats(scores, index)
    factor = n / (n - 1).clamp(min=1)
    adv = torch.where(n > 1, scores * factor - mean * factor, scores)
    adv = adv.unsqueeze(-1) * mask
    return adv, adv


@register_adv_estimator("opo")
@torch.no_grad()
def opo(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: Any = None, **kwargs: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """OPO: baseline = length-weighted mean score of the group (``sum(len*score)/sum(len)``).

    A group of one gets baseline 0 (verl). Deliberate difference: a group whose responses are all
    empty gets baseline 0 instead of verl's 0/0 = NaN.
    """
    scores, mask = _outcome(token_level_rewards, response_mask)
    lengths = mask.sum(dim=-1)
    gid, n_groups = group_ids(index, scores.shape[0])
    gid = gid.to(scores.device)
    zeros = torch.zeros(n_groups, dtype=scores.dtype, device=scores.device)
    weighted = zeros.clone().index_add_(0, gid, lengths * scores)
    total_len = zeros.clone().index_add_(0, gid, lengths)
    count = zeros.clone().index_add_(0, gid, torch.ones_like(scores))
    baseline = torch.where(total_len > 0, weighted / total_len.clamp(min=1e-12), zeros)
    baseline = torch.where(count > 1, baseline, zeros)
    adv = (scores - baseline[gid]).unsqueeze(-1) * mask
    return adv, adv


@register_adv_estimator("gpg")
@torch.no_grad()
def gpg(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any = None,
    epsilon: float = 1e-6,
    f_norm: float = 1.0,
    alpha: float = 1.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GPG: ``alpha * (score - group_mean) / f_norm`` with ``alpha = batch / max(1, #nonzero scores)``.

    As in verl, the ``alpha`` argument is accepted but overwritten by that batch-level factor.
    """
    scores, mask = _outcome(token_level_rewards, response_mask)
    alpha_eff = scores.shape[0] / torch.count_nonzero(scores).clamp(min=1)
    mean, _, _ = group_stats(scores, index)
    adv = (alpha_eff * (scores - mean) / f_norm).unsqueeze(-1) * mask
    return adv, adv


@register_adv_estimator("reinforce_plus_plus_baseline")
@torch.no_grad()
def reinforce_plus_plus_baseline(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: Any = None, **kwargs: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++-baseline: subtract the group mean (a group of one: 0), broadcast over the mask,
    then whiten over the whole batch's valid tokens (verl's ``masked_whiten``)."""
    scores, mask = _outcome(token_level_rewards, response_mask)
    mean, _, _ = group_stats(scores, index)
    adv = (scores - mean).unsqueeze(-1) * mask
    adv = masked_whiten(adv, mask) * mask
    return adv, adv


@register_adv_estimator("reinforce_plus_plus")
@torch.no_grad()
def reinforce_plus_plus(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float | None = None,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++: discounted return (``gamma`` from the argument or ``config.gamma``), carried
    unchanged across masked tokens, zero on them; advantages = whitened returns * mask (verl)."""
    gamma = _cfg(config, "gamma", gamma, 1.0)
    mask = response_mask.to(token_level_rewards.dtype)
    returns = torch.zeros_like(token_level_rewards)
    running = torch.zeros_like(token_level_rewards[:, 0])
    for t in reversed(range(token_level_rewards.shape[1])):
        new_running = token_level_rewards[:, t] + gamma * running
        returns[:, t] = new_running * mask[:, t]
        running = new_running * mask[:, t] + running * (1 - mask[:, t])
    advantages = masked_whiten(returns, mask) * mask
    return advantages, returns


@register_adv_estimator("remax")
@torch.no_grad()
def remax(
    token_level_rewards: torch.Tensor,
    reward_baselines: torch.Tensor,
    response_mask: torch.Tensor,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """ReMax: returns = reverse cumulative sum of masked rewards; advantages = returns - baseline * mask.

    ``reward_baselines`` (batch,) is the reward of the greedy response to the same prompt.
    """
    mask = response_mask.to(token_level_rewards.dtype)
    returns = (token_level_rewards * mask).flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1])
    advantages = returns - reward_baselines.unsqueeze(-1) * mask
    return advantages, returns
