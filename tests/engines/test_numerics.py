"""The parity tolerances: ordered by dtype, growing with depth and width, NaN never passes."""

from __future__ import annotations

import math

import torch

from rlctl.engines.numerics import (
    PASS_FACTOR,
    WARN_FACTOR,
    error_scale,
    gap_tolerance,
    grad_tolerance,
    log_prob_tolerance,
    unit_roundoff,
    worst,
)

SHAPE = dict(layers=4, hidden=128, seq_len=32)


def test_unit_roundoff_is_half_the_machine_epsilon():
    assert unit_roundoff(torch.float32) == 2.0**-24
    assert unit_roundoff(torch.bfloat16) == 2.0**-8
    assert unit_roundoff(torch.float16) == 2.0**-11


def test_scale_is_storage_rounding_plus_float32_accumulation():
    fp32 = error_scale(torch.float32, **SHAPE)
    expected = 2.0**-24 * (math.sqrt(4 * 10) + math.sqrt(4 * (128 + 32)))
    assert math.isclose(fp32, expected)
    bf16, fp16 = error_scale(torch.bfloat16, **SHAPE), error_scale(torch.float16, **SHAPE)
    assert bf16 > fp16 > fp32
    assert error_scale(torch.float32, layers=30, hidden=576, seq_len=32) > fp32  # deeper and wider


def test_tolerance_bands_and_verdicts():
    tol = log_prob_tolerance(torch.float32, **SHAPE)
    assert math.isclose(tol.passes, PASS_FACTOR * error_scale(torch.float32, **SHAPE))
    assert math.isclose(tol.warns, WARN_FACTOR * tol.passes)
    assert tol.verdict(0.0) == "PASS" and tol.verdict(tol.passes) == "PASS"
    assert tol.verdict(tol.passes * 1.01) == "WARN" and tol.verdict(tol.warns * 1.01) == "FAIL"
    assert tol.verdict(float("nan")) == "FAIL"
    assert "float32" in tol.why and "4 layers" in tol.why
    gap = gap_tolerance((torch.float32, torch.bfloat16), **SHAPE)
    assert math.isclose(gap.passes, 2 * log_prob_tolerance(torch.bfloat16, **SHAPE).passes)
    grads = grad_tolerance(torch.float32, **SHAPE, tokens=128)
    assert grads.passes > tol.passes and "128 tokens" in grads.why
    assert worst(["PASS", "FAIL", "WARN"]) == "FAIL" and worst([]) == "PASS"
