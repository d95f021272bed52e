"""Combine a loss's metric parts over micro-batches and data-parallel ranks into the batch's.

Sums and counts are all-reduced (SUM), maxima and minima with MAX (a minimum as a negated
maximum), never the means: the result is the metric of the whole mini-batch whatever the
micro-batch size and world size, padding-only micro-batches included (their parts are empty).
A plain float from a loss function is a per-micro-batch value: it is averaged over the
micro-batches of all ranks, as before parts existed.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping

import torch
import torch.distributed as dist

from rlctl.algorithms.metric_parts import EffectiveSampleSize, Max, Mean, MetricPart, Min, merge
from rlctl.errors import RunError

_SUMMED = {Mean: ("total", "count"), EffectiveSampleSize: ("sum_w", "sum_w2", "count")}


class BatchMetrics:
    """Accumulates metric parts, then :meth:`reduce` gives the parts of everything added on all ranks."""

    def __init__(self) -> None:
        self.parts: dict[str, MetricPart] = {}

    def add(self, metrics: Mapping[str, MetricPart | float]) -> None:
        """Add one micro-batch's (or one already reduced mini-batch's) metrics."""
        for key, value in metrics.items():
            part = value if isinstance(value, MetricPart) else Mean(float(value), 1.0)
            self.parts[key] = merge(self.parts[key], part) if key in self.parts else part

    def reduce(self, group: dist.ProcessGroup | None = None, device: torch.device | None = None) -> dict:
        """The parts over every rank of ``group`` (this rank's alone when None). Every rank must
        hold the same keys of the same kinds; a mismatch is a RunError, not a silent mix-up."""
        if group is None:
            return dict(self.parts)
        keys = sorted(self.parts)
        signature = float(zlib.crc32(repr([(k, type(self.parts[k]).__name__) for k in keys]).encode()))
        peaks = [self._peak(self.parts[k]) for k in keys if isinstance(self.parts[k], Max | Min)]
        peak = torch.tensor([*peaks, signature, -signature], dtype=torch.float64, device=device)
        dist.all_reduce(peak, op=dist.ReduceOp.MAX, group=group)
        if float(peak[-2]) != signature or float(peak[-1]) != -signature:
            raise RunError(f"ranks report different training metrics; this rank: {', '.join(keys)}")
        summed_keys = [k for k in keys if type(self.parts[k]) in _SUMMED]
        flat = [getattr(self.parts[k], f) for k in summed_keys for f in _SUMMED[type(self.parts[k])]]
        total = torch.tensor(flat, dtype=torch.float64, device=device)
        if flat:
            dist.all_reduce(total, group=group)
        out: dict[str, MetricPart] = {}
        values = iter(total.tolist())
        for key in summed_keys:
            kind = type(self.parts[key])
            out[key] = kind(*(next(values) for _ in _SUMMED[kind]))
        peaks_iter = iter(peak[:-2].tolist())
        for key in keys:
            part = self.parts[key]
            if isinstance(part, Max):
                out[key] = Max(next(peaks_iter))
            elif isinstance(part, Min):
                out[key] = Min(-next(peaks_iter))
        return {k: out[k] for k in keys}

    @staticmethod
    def _peak(part: Max | Min) -> float:
        return part.value if isinstance(part, Max) else -part.value
