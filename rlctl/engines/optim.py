"""Optimiser settings, the loss-scale contract and the LR schedule of the training engines."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from rlctl.engines.engine_specs import OptimConfig


@dataclass(frozen=True)
class LossScale:
    """Totals of one mini-batch over ALL micro-batches and DP ranks (all-reduced by the engine).

    A loss function returns each micro-batch's exact share of the mini-batch loss, e.g. token-mean
    ``sum(l * mask) / global_tokens * dp_size``; ``dp_size`` undoes the mean that FSDP's gradient
    reduce-scatter takes over data-parallel ranks. The engine calls ``backward`` on it as is.
    Rows with an all-zero ``response_mask`` (padding that only makes shapes divide) count in
    neither total, the same rows ``rlctl.algorithms.agg_loss`` leaves out of its seq-mean modes.
    """

    global_tokens: int  # loss tokens (response_mask sum)
    global_seqs: int  # sequences with at least one loss token
    dp_size: int


def lr_lambda(cfg: OptimConfig) -> Callable[[int], float]:
    """Multiplier of the base LR at step ``s`` (0-based count of schedule steps already taken).

    verl's ``get_constant_schedule_with_warmup`` / ``get_cosine_schedule_with_warmup`` (and HF's):
    warmup is ``s / warmup_steps``, so with warmup the first step runs at LR 0, and verl's worker
    reads the LR, updates, then steps the schedule, as ``update_actor`` does here. The cosine
    then goes from 1 at ``s = warmup_steps`` to ``min_lr_ratio`` at ``s = total_steps`` (held there
    after, where verl's cosine would rise again). ``warmup_from_zero=False``: warmup
    ``(s + 1) / warmup_steps`` (rlctl's SFT).
    """

    offset = 0 if cfg.warmup_from_zero else 1

    def f(step: int) -> float:
        if cfg.warmup_steps > 0 and step < cfg.warmup_steps:
            return (step + offset) / cfg.warmup_steps
        if cfg.schedule == "constant":
            return 1.0
        span = max(1, cfg.total_steps - cfg.warmup_steps)
        progress = min(1.0, (step - cfg.warmup_steps) / span)
        cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
        return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * cosine

    return f


def build_optimizer(
    params, cfg: OptimConfig
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over ``params`` and its LambdaLR schedule.

    The fused kernel (one pass per parameter group instead of ~10 small ops per tensor; 6.3 ms ->
    1.1 ms per step on the embedded default's 0.8M parameters, CPU) wherever torch has one for the
    parameters' device; elsewhere torch's default implementation.
    """
    params = list(params)
    opt = torch.optim.AdamW(
        params,
        lr=cfg.lr,
        betas=tuple(cfg.betas),
        eps=cfg.eps,
        weight_decay=cfg.weight_decay,
        fused=True if params and _fused_supported(params) else None,
    )
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(cfg))


def _fused_supported(params: list[torch.Tensor]) -> bool:
    """Whether torch's fused AdamW runs on every parameter (floating point, a device it has kernels for)."""
    try:  # torch's own list (private, present in every torch this package supports)
        from torch.utils._foreach_utils import _get_fused_kernels_supported_devices
    except ImportError:
        return False
    devices = set(_get_fused_kernels_supported_devices())
    return all(p.is_floating_point() and p.device.type in devices for p in params)
