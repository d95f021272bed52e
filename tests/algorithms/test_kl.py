"""KL estimators, KL in the reward with fixed/adaptive controllers, KL as a loss."""

from __future__ import annotations

import math

import pytest
import torch

from rlctl.algorithms import (
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    kl_loss,
    kl_penalty,
    make_kl_controller,
)
from rlctl.errors import UserError

LP = torch.tensor([-1.0, -2.0])
REF = torch.tensor([-2.0, -1.0])


@pytest.mark.parametrize(
    ("kinds", "expected"),
    [
        (("kl", "k1"), [1.0, -1.0]),
        (("abs",), [1.0, 1.0]),
        (("mse", "k2"), [0.5, 0.5]),
        (("low_var_kl", "k3"), [math.exp(-1) - (-1) - 1, math.exp(1) - 1 - 1]),
    ],
)
def test_estimators_hand_computed(kinds, expected) -> None:
    for kind in kinds:
        torch.testing.assert_close(kl_penalty(LP, REF, kind), torch.tensor(expected))
        torch.testing.assert_close(kl_penalty(LP, REF, kind + "+"), torch.tensor(expected))


def test_k3_clamps() -> None:
    out = kl_penalty(torch.tensor([0.0]), torch.tensor([-50.0]), "k3")  # d clamped to -20, then kl to 10
    assert out.item() == 10.0


@pytest.mark.parametrize("kind", ["k1+", "abs+", "k3+", "low_var_kl+", "k2+"])
def test_straight_through_uses_k2_gradient(kind: str) -> None:
    lp = LP.clone().requires_grad_(True)
    kl_penalty(lp, REF, kind).sum().backward()
    torch.testing.assert_close(lp.grad, LP - REF)  # d/dlp 0.5 (lp - ref)^2


def test_k1_gradient_without_plus_is_one() -> None:
    lp = LP.clone().requires_grad_(True)
    kl_penalty(lp, REF, "k1").sum().backward()
    torch.testing.assert_close(lp.grad, torch.ones(2))


def test_unknown_kind_lists_registered() -> None:
    with pytest.raises(UserError, match="unknown KL estimator 'k4'.*low_var_kl"):
        kl_penalty(LP, REF, "k4")


def test_apply_kl_penalty_fixed_and_adaptive() -> None:
    scores = torch.tensor([[0.0, 1.0], [0.0, 3.0]])
    old = torch.tensor([[-1.0, -1.0], [-1.0, -1.0]])
    ref = torch.tensor([[-2.0, -1.0], [-5.0, -5.0]])
    mask = torch.tensor([[1.0, 1.0], [0.0, 0.0]])  # second row empty: no penalty, counts 0 in the mean
    rewards, metrics = apply_kl_penalty(scores, old, ref, mask, FixedKLController(0.1), "kl")
    torch.testing.assert_close(rewards, torch.tensor([[-0.1, 1.0], [0.0, 3.0]]))
    assert metrics == pytest.approx({"reward_kl_penalty": 0.25, "reward_kl_penalty_coeff": 0.1})

    ctrl = AdaptiveKLController(init_kl_coef=0.1, target_kl=0.1, horizon=10)
    _, metrics = apply_kl_penalty(scores, old, ref, mask, ctrl, "kl")
    assert metrics["reward_kl_penalty_coeff"] == 0.1  # the coefficient used, before the update
    # err = clip(0.25 / 0.1 - 1, -0.2, 0.2) = 0.2; value *= 1 + 0.2 * 2 / 10
    assert ctrl.value == pytest.approx(0.1 * 1.04)
    ctrl.update(current_kl=0.0, n_steps=5)  # err = -1 -> clipped to -0.2
    assert ctrl.value == pytest.approx(0.1 * 1.04 * (1 - 0.2 * 5 / 10))


def test_controllers_state_and_factory() -> None:
    ctrl = make_kl_controller("adaptive", kl_coef=0.3, target_kl=0.2, horizon=100)
    assert isinstance(ctrl, AdaptiveKLController)
    ctrl.update(1.0, 50)
    fresh = make_kl_controller("adaptive", kl_coef=0.3, target_kl=0.2, horizon=100)
    fresh.load_state_dict(ctrl.state_dict())
    assert fresh.value == ctrl.value != 0.3
    fixed = make_kl_controller("fixed", kl_coef=0.05)
    fixed.update(10.0, 100)
    assert fixed.value == 0.05
    with pytest.raises(UserError, match="kl_ctrl.type = 'pid'"):
        make_kl_controller("pid")
    with pytest.raises(UserError, match="horizon = 0"):
        make_kl_controller("adaptive", horizon=0)


def test_kl_loss_aggregates() -> None:
    lp = torch.tensor([[-1.0, -2.0, 0.0]], requires_grad=True)
    ref = torch.tensor([[-2.0, -1.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    loss, metrics = kl_loss(lp, ref, mask, kind="k1")
    assert loss.item() == pytest.approx(0.0)
    loss, metrics = kl_loss(lp, ref, mask, kind="k2", loss_agg_mode="seq-mean-token-sum")
    assert loss.item() == pytest.approx(1.0)
    assert metrics == {"kl_loss": pytest.approx(1.0)}
    loss.backward()
    torch.testing.assert_close(lp.grad, torch.tensor([[1.0, -1.0, 0.0]]))
