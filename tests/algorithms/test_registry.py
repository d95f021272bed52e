"""Registries: verl's names are there, a researcher's plain function registers, errors are clear."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from rlctl.algorithms import (
    ADV_ESTIMATORS,
    POLICY_LOSSES,
    get_adv_estimator,
    get_policy_loss,
    register_adv_estimator,
    register_policy_loss,
)
from rlctl.algorithms.registry import Registry
from rlctl.errors import UserError


def test_verl_names_registered() -> None:
    assert set(ADV_ESTIMATORS.names()) >= {
        "gae",
        "grpo",
        "rloo",
        "reinforce_plus_plus",
        "reinforce_plus_plus_baseline",
        "remax",
        "opo",
        "gpg",
    }
    assert set(POLICY_LOSSES.names()) >= {"vanilla", "gspo", "cispo", "gpg"}


def test_unknown_name_lists_registered() -> None:
    with pytest.raises(UserError, match=r"unknown advantage estimator 'grpoo'; registered: .*gae.*grpo"):
        get_adv_estimator("grpoo")
    with pytest.raises(UserError, match="unknown policy loss 'ppo'; registered: cispo, gpg, gspo"):
        get_policy_loss("ppo")


def test_researcher_registers_a_plain_function() -> None:
    reg = Registry("advantage estimator")

    @reg.register("median_baseline")
    def median_baseline(token_level_rewards, response_mask, **kwargs):
        scores = token_level_rewards.sum(-1)
        adv = (scores - scores.median()).unsqueeze(-1) * response_mask
        return adv, adv

    fn = reg.get("median_baseline")
    assert fn is median_baseline
    adv, _ = fn(torch.tensor([[1.0], [2.0], [4.0]]), torch.ones(3, 1))
    assert adv.flatten().tolist() == [-1.0, 0.0, 2.0]
    reg.register("median_baseline")(median_baseline)  # same function again: fine
    with pytest.raises(UserError, match="already registered"):
        reg.register("median_baseline")(lambda **k: None)
    reg.register("median_baseline", override=True)(lambda **k: None)


def test_global_decorators_roundtrip() -> None:
    @register_adv_estimator("test_only_zero")
    def zero(token_level_rewards, response_mask, **kwargs):
        return torch.zeros_like(response_mask), torch.zeros_like(response_mask)

    @register_policy_loss("test_only_loss")
    def loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode=None, config=None, w=None):
        return (log_prob * 0).sum(), {}

    try:
        assert get_adv_estimator("test_only_zero") is zero
        assert get_policy_loss("test_only_loss") is loss
        with pytest.raises(UserError, match="already registered"):
            register_adv_estimator("grpo")(zero)
    finally:
        ADV_ESTIMATORS.unregister("test_only_zero")
        POLICY_LOSSES.unregister("test_only_loss")
    with pytest.raises(UserError, match="unknown"):
        get_adv_estimator("test_only_zero")


def test_algorithms_import_only_torch_numpy_and_errors() -> None:
    code = (
        "import sys, rlctl.algorithms; "
        "mods = sorted(m for m in sys.modules if m.startswith('rlctl')); print(mods); "
        "bad = [m for m in ('ray', 'transformers', 'verl', 'click') if m in sys.modules]; print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    mods, bad = out.strip().splitlines()
    assert all(
        m in ("'rlctl'", "'rlctl.errors'") or m.startswith("'rlctl.algorithms")
        for m in mods[1:-1].split(", ")
    )
    assert bad == "[]"
