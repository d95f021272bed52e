"""Metric parts: what a batch's metric is made of, so that pieces of the batch combine exactly.

A loss function sees one micro-batch on one rank; a mean of its means is not the batch's mean.
It reports parts instead: a :class:`Mean` as (sum, count) (count = tokens, or sequences for a
per-sequence metric), a :class:`Max` or :class:`Min`, or verl's effective sample size as its
three sums. Parts of disjoint pieces :func:`merge` into the parts of their union; :func:`result`
is the metric. An empty piece (padding only) is ``Mean(0, 0)`` / ``Max(-inf)`` / ``Min(inf)`` and
changes nothing; a metric with nothing in it at all is 0.0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from rlctl.algorithms.masked import masked_sum


@dataclass(frozen=True)
class Mean:
    """``total / count`` over the batch."""

    total: float
    count: float


@dataclass(frozen=True)
class Max:
    """The batch's largest value (``-inf`` where a piece has none)."""

    value: float


@dataclass(frozen=True)
class Min:
    """The batch's smallest value (``inf`` where a piece has none)."""

    value: float


@dataclass(frozen=True)
class EffectiveSampleSize:
    """verl's ``rollout_is_eff_sample_size`` ``1 / mean((w / mean(w))^2)`` from its sums."""

    sum_w: float
    sum_w2: float
    count: float


MetricPart = Mean | Max | Min | EffectiveSampleSize


def mean_of(values: torch.Tensor, mask: torch.Tensor) -> Mean:
    """Parts of the masked mean of ``values`` (count: the mask's sum)."""
    return Mean(float(masked_sum(values.detach().double(), mask)), float(mask.sum()))


def max_of(values: torch.Tensor, mask: torch.Tensor) -> Max:
    """The largest of ``values`` where ``mask`` is set."""
    picked = values.detach()[mask.bool()]
    return Max(float(picked.max()) if picked.numel() else -math.inf)


def min_of(values: torch.Tensor, mask: torch.Tensor) -> Min:
    """The smallest of ``values`` where ``mask`` is set."""
    picked = values.detach()[mask.bool()]
    return Min(float(picked.min()) if picked.numel() else math.inf)


def merge(a: MetricPart, b: MetricPart) -> MetricPart:
    """The parts of the union of two disjoint pieces (the same kind of part)."""
    if type(a) is not type(b):
        raise TypeError(f"cannot merge metric parts of kinds {type(a).__name__} and {type(b).__name__}")
    if isinstance(a, Mean):
        return Mean(a.total + b.total, a.count + b.count)
    if isinstance(a, Max):
        return Max(max(a.value, b.value))
    if isinstance(a, Min):
        return Min(min(a.value, b.value))
    return EffectiveSampleSize(a.sum_w + b.sum_w, a.sum_w2 + b.sum_w2, a.count + b.count)


def result(part: MetricPart | float) -> float:
    """The metric the parts make (a plain number is already one)."""
    if isinstance(part, Mean):
        return part.total / part.count if part.count > 0 else 0.0
    if isinstance(part, Max | Min):
        return part.value if math.isfinite(part.value) else 0.0
    if isinstance(part, EffectiveSampleSize):
        # verl's arithmetic, eps included: masked means divide by count + 1e-8
        mean_w = part.sum_w / (part.count + 1e-8)
        second = part.sum_w2 / (mean_w + 1e-8) ** 2 / (part.count + 1e-8)
        return 1.0 / second if second > 0 else 0.0
    return float(part)


def results(parts: Mapping[str, MetricPart | float]) -> dict[str, float]:
    """Every metric of ``parts``."""
    return {k: result(v) for k, v in parts.items()}
