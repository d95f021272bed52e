"""Error statistics of ``rlctl bench parity``: relative errors with a floor, the train-vs-rollout gap,
per-layer gradient groups and the optimiser step with its float32 storage rounding."""

from __future__ import annotations

import torch

from rlctl.bench.parity_errors import error_stats, gap_stats, grad_norm_stats, update_stats
from rlctl.bench.parity_reference import group_norms, layer_of


def test_error_stats_and_gap():
    stats = error_stats(torch.tensor([1.0, -2.0, 0.0]), torch.tensor([1.0, -2.5, 0.0]))
    assert stats["max_abs"] == 0.5 and abs(stats["mean_abs"] - 0.5 / 3) < 1e-12
    assert abs(stats["max_rel"] - 0.5 / 2.501) < 1e-12  # relative to |ref| + 1e-3
    gap = gap_stats(torch.arange(100.0), torch.zeros(100))
    assert gap["max"] == 99 and gap["mean"] == 49.5 and 97 < gap["p99"] < 99


def test_gradients_group_by_layer():
    assert layer_of("model.layers.12.mlp.up_proj.weight") == "layer 12"
    assert layer_of("model.embed_tokens.weight") == "embed_tokens" and layer_of("lm_head.weight") == "lm_head"
    grads = {
        "model.layers.0.a.weight": torch.full((4,), 1.0),
        "model.layers.0.b.weight": torch.full((5,), 0.0),
    }
    assert group_norms(grads) == {"layer 0": 2.0}
    stats = grad_norm_stats({"layer 0": 2.002}, {"layer 0": 2.0, "layer 1": 1.0})
    assert stats["missing"] == ["layer 1"] and stats["max_rel"] == float("inf")
    assert abs(stats["per_layer"]["layer 0"]["rel"] - 1e-3) < 1e-9


def test_step_rounded_to_float32_masters_stays_within_its_storage_term_and_a_wrong_lr_does_not():
    g = torch.Generator().manual_seed(0)
    weights = {"w": torch.randn(10_000, generator=g, dtype=torch.float64) * 0.1}
    lr = 2e-5
    exact = {"w": -lr * torch.sign(torch.randn(10_000, generator=g, dtype=torch.float64))}
    stepped32 = (weights["w"].float() + exact["w"].float()).double()
    rounded = {"w": stepped32 - weights["w"].float().double()}
    stats = update_stats(rounded, exact, weights)
    assert 0 < stats["rel_l1"] <= stats["storage_rounding"] and stats["sign_flips"] == 0
    wrong = update_stats({"w": exact["w"] * 1.1}, exact, weights)
    assert abs(wrong["rel_l1"] - 0.1) < 1e-9 and wrong["rel_l1"] > 10 * wrong["storage_rounding"]
