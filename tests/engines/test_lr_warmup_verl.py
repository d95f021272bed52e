"""The LR schedule step for step as verl's: ``get_constant_schedule_with_warmup`` /
``get_cosine_schedule_with_warmup`` (verl/utils/torch_functional.py), read by the worker before the
update and stepped once after it (verl's ``update_actor``: ``get_last_lr()``, then
``lr_scheduler.step()``)."""

from __future__ import annotations

import math

import pytest

from rlctl.engines.fsdp_train import FSDPTrainEngine
from rlctl.engines.optim import OptimConfig, lr_lambda
from tests.engines.helpers import make_batch, make_model, token_mean_loss

LR = 1e-3


def _verl_constant(step: int, warmup: int) -> float:
    """verl since its PR #1463 (before it, warmup 0 gave LR 0 on the first step), HF's too."""
    if step < warmup:
        return float(step) / float(max(1.0, warmup))
    return 1.0


def _verl_cosine(step: int, warmup: int, total: int, min_lr_ratio: float) -> float:
    """verl (num_cycles 0.5, init_lr_ratio None -> 0)."""
    if step < warmup:
        return float(step) / float(max(1, warmup))
    progress = float(step - warmup) / float(max(1, total - warmup))
    x = math.cos(math.pi * 0.5 * 2.0 * progress)
    coef, intercept = (1 - min_lr_ratio) * 0.5, (1 + min_lr_ratio) * 0.5
    return max(min_lr_ratio, x * coef + intercept)


@pytest.mark.parametrize("warmup", [0, 1, 2, 5])
@pytest.mark.parametrize("min_lr_ratio", [0.0, 0.1])
def test_lr_lambda_is_verls_schedule(warmup: int, min_lr_ratio: float) -> None:
    total = 12
    const = lr_lambda(OptimConfig(warmup_steps=warmup))
    cosine = lr_lambda(
        OptimConfig(warmup_steps=warmup, total_steps=total, schedule="cosine", min_lr_ratio=min_lr_ratio)
    )
    for s in range(total + 1):
        assert const(s) == pytest.approx(_verl_constant(s, warmup), abs=1e-12), s
        assert cosine(s) == pytest.approx(_verl_cosine(s, warmup, total, min_lr_ratio), abs=1e-12), s


def test_rl_steps_train_at_verls_lr_sequence(tmp_path) -> None:
    """Two optimiser steps per RL step, the schedule stepped once per RL step: the LR each update
    ran at, against verl's sequence written out by hand (warmup 3, cosine to 0.1 at step 8)."""
    model_dir = make_model(tmp_path / "m", seed=1)
    optim = OptimConfig(lr=LR, warmup_steps=3, total_steps=8, schedule="cosine", min_lr_ratio=0.1)
    engine = FSDPTrainEngine(model_dir, optim=optim)
    seen: list[float] = []
    engine.optimizer.register_step_pre_hook(lambda opt, a, k: seen.append(opt.param_groups[0]["lr"]))
    reported = []
    for _ in range(8):
        for _ in range(2):
            reported.append(engine.train_batch(make_batch(2), token_mean_loss, step_schedule=False)["lr"])
        engine.advance_schedule()
    c = [math.cos(math.pi * k / 5) for k in range(1, 5)]
    want = [0.0, 1 / 3, 2 / 3, 1.0, *(0.1 + 0.45 * (1 + x) for x in c)]
    assert want[4] == pytest.approx(0.914058, abs=1e-6) and want[7] == pytest.approx(0.185942, abs=1e-6)
    per_update = [LR * lr for lr in want for _ in range(2)]
    assert seen == pytest.approx(per_update, abs=1e-12)
    assert reported == pytest.approx(per_update, abs=1e-12)
    assert engine.scheduler.get_last_lr()[0] == pytest.approx(0.1 * LR)  # step 8 = total_steps: the floor


def test_sft_keeps_the_warmup_its_shipped_checkpoints_were_made_with() -> None:
    sft = lr_lambda(OptimConfig(warmup_steps=4, warmup_from_zero=False))
    assert [sft(s) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
