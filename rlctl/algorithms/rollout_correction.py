"""Rollout correction: importance weights between the rollout engine and the training engine.

The rollout engine (vLLM, SGLang, HF generate in bf16, ...) samples from a slightly different
distribution than the training engine's recomputed ``old_log_prob``. The weight
``pi_train / pi_rollout = exp(old_log_prob - rollout_log_prob)`` corrects for it, per token or per
sequence (product of token ratios), with verl's safety clamp of the log-ratio to [-20, 20].

- ``mode="truncate"`` (TIS): weights clamped above at ``threshold``.
- ``mode="mask"`` (IcePop): weights outside ``[threshold_lower, threshold]`` set to 0; the lower
  bound defaults to ``1 / threshold``.

Same weights as verl's ``compute_rollout_correction_weights`` (``rollout_is="token"|"sequence"``,
threshold ``2.0`` or ``"lower_upper"``). Weights are detached and zero on padding. The metrics are
a subset of verl's under the same names (without the ``rollout_corr/`` prefix); unlike verl an
all-empty mask gives zeros instead of raising, and sequence-level statistics leave rows without
a response token (padding) out.
"""

from __future__ import annotations

import math

import torch

from rlctl.algorithms.masked import masked_sum
from rlctl.algorithms.metric_parts import (
    EffectiveSampleSize,
    MetricPart,
    max_of,
    mean_of,
    min_of,
    results,
)
from rlctl.errors import UserError

SAFETY_BOUND = 20.0


@torch.no_grad()
def rollout_is_weights(
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    level: str = "token",
    mode: str = "truncate",
    threshold: float = 2.0,
    threshold_lower: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Importance weights (batch, len) to multiply into the policy loss, and float metrics."""
    weights, parts = rollout_is_weights_and_parts(
        old_log_prob, rollout_log_prob, response_mask, level, mode, threshold, threshold_lower
    )
    return weights, results(parts)


@torch.no_grad()
def rollout_is_weights_and_parts(
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    level: str = "token",
    mode: str = "truncate",
    threshold: float = 2.0,
    threshold_lower: float | None = None,
) -> tuple[torch.Tensor, dict[str, MetricPart]]:
    """:func:`rollout_is_weights` with its metrics as parts (:mod:`.metric_parts`), which combine
    over micro-batches and ranks into the batch's. Token metrics weigh tokens; sequence ones
    weigh the sequences with a response token (verl also counts empty rows)."""
    if level not in ("token", "sequence"):
        raise UserError(f"rollout correction level = {level!r}: expected 'token' or 'sequence'")
    if mode not in ("truncate", "mask"):
        raise UserError(f"rollout correction mode = {mode!r}: expected 'truncate' or 'mask'")
    if not threshold > 0:
        raise UserError(f"rollout correction threshold = {threshold}: expected a positive number")
    lower = (1.0 / threshold) if threshold_lower is None else float(threshold_lower)
    if not 0 < lower <= threshold:
        raise UserError(f"rollout correction threshold_lower = {lower}: expected 0 < lower <= {threshold}")
    if old_log_prob.shape != rollout_log_prob.shape or old_log_prob.shape != response_mask.shape:
        raise ValueError(
            f"shapes differ: old_log_prob {tuple(old_log_prob.shape)}, rollout_log_prob "
            f"{tuple(rollout_log_prob.shape)}, response_mask {tuple(response_mask.shape)}"
        )
    mask = response_mask.to(old_log_prob.dtype)
    log_ratio = old_log_prob - rollout_log_prob
    if level == "token":
        raw = torch.exp(torch.clamp(log_ratio, -SAFETY_BOUND, SAFETY_BOUND))
    else:
        seq = masked_sum(log_ratio, mask, dim=-1).unsqueeze(-1)
        raw = torch.exp(torch.clamp(seq, -SAFETY_BOUND, SAFETY_BOUND)).expand_as(log_ratio)
    raw = raw * mask
    if mode == "truncate":
        weights = raw.clamp(max=threshold)
    else:
        keep = (raw >= lower) & (raw <= threshold)
        weights = torch.where(keep, raw, torch.zeros_like(raw))

    parts: dict[str, MetricPart] = {"rollout_is_mean": mean_of(weights, mask)}
    if level == "token":
        parts["rollout_is_max"] = max_of(weights, mask)
        parts["rollout_is_min"] = min_of(weights, mask)
        parts["rollout_is_ratio_fraction_high"] = mean_of((raw > threshold).to(mask.dtype), mask)
        parts["rollout_is_ratio_fraction_low"] = mean_of((raw < lower).to(mask.dtype), mask)
    else:  # verl: sequence stats from the unclamped per-sequence log-ratio
        seq, rows = seq.squeeze(-1), (mask.sum(-1) > 0).to(mask.dtype)
        parts["rollout_is_max"] = max_of(torch.exp(seq.clamp(max=SAFETY_BOUND)), rows)
        parts["rollout_is_min"] = min_of(torch.exp(seq), rows)
        parts["rollout_is_ratio_fraction_high"] = mean_of((seq > math.log(threshold)).to(mask.dtype), rows)
        parts["rollout_is_ratio_fraction_low"] = mean_of((seq < math.log(lower)).to(mask.dtype), rows)
    parts["kl"] = mean_of(rollout_log_prob - old_log_prob, mask)
    if mode == "mask":
        out = (raw < lower) | (raw > threshold)
        parts["rollout_is_oob_ratio"] = mean_of(out.to(mask.dtype), mask)
    w = weights.clamp(min=0.0, max=threshold).double()
    parts["rollout_is_eff_sample_size"] = EffectiveSampleSize(
        float(masked_sum(w, mask)), float(masked_sum(w.square(), mask)), float(mask.sum())
    )
    return weights.detach(), parts
