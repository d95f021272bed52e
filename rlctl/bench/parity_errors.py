"""Error statistics of one quantity against its float64 reference, and the verdict on them.

Absolute error ``|x - ref|``; relative error ``|x - ref| / (|ref| + REL_FLOOR)``: the floor keeps a
reference near zero (a log-prob of a near-certain token, a layer with almost no gradient) from
turning a rounding error into an infinite relative one. Each quantity is judged on one named
statistic (``judged_on``) against its :class:`~rlctl.engines.numerics.Tolerance`.
"""

from __future__ import annotations

import torch

from rlctl.engines.numerics import Tolerance, unit_roundoff

REL_FLOOR = 1e-3
NORM_FLOOR = 1e-12  # gradient norms are compared relative to themselves (a layer's norm is never ~0)


def error_stats(values: torch.Tensor, reference: torch.Tensor, floor: float = REL_FLOOR) -> dict[str, float]:
    """max/mean absolute and relative error of ``values`` (any shape, flattened) against ``reference``
    (relative to ``|reference| + floor``)."""
    x, ref = values.detach().double().flatten().cpu(), reference.detach().double().flatten().cpu()
    if x.numel() == 0:
        return {"n": 0, "max_abs": 0.0, "mean_abs": 0.0, "max_rel": 0.0, "mean_rel": 0.0}
    abs_err = (x - ref).abs()
    rel_err = abs_err / (ref.abs() + floor)
    return {
        "n": int(x.numel()),
        "max_abs": float(abs_err.max()),
        "mean_abs": float(abs_err.mean()),
        "max_rel": float(rel_err.max()),
        "mean_rel": float(rel_err.mean()),
    }


def judged(stats: dict[str, float], judged_on: str, tolerance: Tolerance) -> dict:
    """``stats`` with the verdict of ``stats[judged_on]`` against ``tolerance`` and why."""
    value = stats[judged_on]
    return {
        **stats,
        "judged_on": judged_on,
        "tolerance": tolerance.to_dict(),
        "verdict": tolerance.verdict(value),
    }


def masked(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The entries of ``values`` where ``mask`` is set, flattened (host tensors)."""
    return values.detach().cpu()[mask.cpu().bool()]


def gap_stats(a: torch.Tensor, b: torch.Tensor) -> dict[str, float]:
    """mean, p99 and max of ``|a - b|`` over matching entries (the train-vs-rollout gap)."""
    gap = (a.double() - b.double()).abs().flatten()
    if gap.numel() == 0:
        return {"n": 0, "mean": 0.0, "p99": 0.0, "max": 0.0}
    return {
        "n": int(gap.numel()),
        "mean": float(gap.mean()),
        "p99": float(torch.quantile(gap, 0.99)),
        "max": float(gap.max()),
    }


def update_stats(
    update: dict[str, torch.Tensor], reference: dict[str, torch.Tensor], weights: dict[str, torch.Tensor]
) -> dict[str, float]:
    """Error of one optimiser step's parameter change against the exact step's, over all parameters.

    ``rel_l1`` = sum |d - d_ref| / sum |d_ref|: how much of the step went wrong. ``sign_flips`` is the
    fraction of elements moved the other way (AdamW's first step is about ``lr * sign(grad)``, so a
    gradient within its rounding error of zero may flip). ``storage_rounding`` = u(float32) *
    sum |w| / sum |d_ref| bounds what storing the stepped float32 master weights ``w`` costs: each
    rounds by up to ``u * |w|``, a share of the step that grows as the learning rate shrinks.
    """
    names = [n for n in reference if n in update]
    got = torch.cat([update[n].double().flatten().cpu() for n in names])
    ref = torch.cat([reference[n].double().flatten().cpu() for n in names])
    stored = sum(float(weights[n].double().abs().sum()) for n in names if n in weights)
    stats = error_stats(got, ref)
    scale = float(ref.abs().sum().clamp_min(1e-300))
    stats["rel_l1"] = float((got - ref).abs().sum()) / scale
    moved = (ref != 0) & (got != 0)
    stats["sign_flips"] = float(((got.sign() != ref.sign()) & moved).double().mean())
    stats["storage_rounding"] = unit_roundoff(torch.float32) * stored / scale
    return stats


def grad_norm_stats(norms: dict[str, float], reference: dict[str, float]) -> dict:
    """Relative error of each group's gradient norm, and the statistics over groups."""
    groups = [g for g in reference if g in norms]
    got = torch.tensor([norms[g] for g in groups], dtype=torch.float64)
    ref = torch.tensor([reference[g] for g in groups], dtype=torch.float64)
    stats = error_stats(got, ref, floor=NORM_FLOOR)
    per = (got - ref).abs() / (ref.abs() + NORM_FLOOR)
    stats["per_layer"] = {
        g: {"norm": norms[g], "reference": reference[g], "rel": float(r)}
        for g, r in zip(groups, per, strict=True)
    }
    missing = sorted(set(reference) - set(norms))
    if missing:
        stats["missing"] = missing
        stats["max_rel"] = float("inf")
    return stats
