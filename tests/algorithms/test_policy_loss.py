"""Hand-computed policy losses (values, gradients and metrics), value loss and entropy."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from rlctl.algorithms import (
    PolicyLossConfig,
    actor_loss,
    entropy_from_logits,
    entropy_loss,
    get_policy_loss,
    value_loss,
)
from rlctl.errors import UserError

CFG = PolicyLossConfig(clip_ratio=0.2, clip_ratio_high=0.28)  # DAPO clip-higher: [0.8, 1.28]


def _four_tokens():
    """One row, four tokens, each hitting a different branch of PPO-clip, plus a masked 5th token."""
    old = torch.zeros(1, 5)
    lp = torch.tensor([[0.5, 2.0, -0.5, 0.0, 100.0]], requires_grad=True)
    adv = torch.tensor([[1.0, -1.0, -1.0, 1.0, 1.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]])
    return old, lp, adv, mask


def test_vanilla_branches_hand_computed() -> None:
    old, lp, adv, mask = _four_tokens()
    loss, metrics = get_policy_loss("vanilla")(old, lp, adv, mask, None, CFG)
    # token 1: A>0, r=e^0.5 -> clipped at 1.28 -> -1.28
    # token 2: A<0, r=e^2 -> -A*r = 7.39 capped by dual clip at -A*3 = 3
    # token 3: A<0, r=e^-0.5 -> clipped up at 0.8 -> 0.8
    # token 4: r=1 -> -1
    assert loss.item() == pytest.approx((-1.28 + 3.0 + 0.8 - 1.0) / 4)
    assert metrics == pytest.approx({"pg_clipfrac": 0.5, "ppo_kl": -0.5, "pg_clipfrac_lower": 0.25})
    assert all(isinstance(v, float) for v in metrics.values())
    loss.backward()
    # clipped tokens carry no gradient; token 4: d(-A e^{lp-old})/dlp = -1, over 4 tokens
    torch.testing.assert_close(lp.grad, torch.tensor([[0.0, 0.0, 0.0, -0.25, 0.0]]))


def test_vanilla_symmetric_clip_and_rollout_weights() -> None:
    old, lp, adv, mask = _four_tokens()
    sym = PolicyLossConfig(clip_ratio=0.2)
    loss, _ = get_policy_loss("vanilla")(old, lp, adv, mask, "token-mean", sym)
    assert loss.item() == pytest.approx((-1.2 + 3.0 + 0.8 - 1.0) / 4)
    weights = torch.tensor([[1.0, 0.5, 2.0, 1.0, 9.0]])
    loss, _ = get_policy_loss("vanilla")(old, lp, adv, mask, "token-mean", CFG, weights)
    assert loss.item() == pytest.approx((-1.28 + 1.5 + 1.6 - 1.0) / 4)


def test_vanilla_seq_mean_token_sum_mode_argument_overrides_config() -> None:
    old, lp, adv, mask = _four_tokens()
    loss, _ = get_policy_loss("vanilla")(old, lp, adv, mask, "seq-mean-token-sum", CFG)
    assert loss.item() == pytest.approx(-1.28 + 3.0 + 0.8 - 1.0)


def test_config_validation() -> None:
    with pytest.raises(UserError, match="clip_ratio_c = 1.0"):
        PolicyLossConfig(clip_ratio_c=1.0)
    with pytest.raises(UserError, match="loss_agg_mode = 'mean'"):
        PolicyLossConfig(loss_agg_mode="mean")
    with pytest.raises(UserError, match="clip_ratio_low = -0.1"):
        PolicyLossConfig(clip_ratio_low=-0.1)
    cfg = CFG.with_batch(global_tokens=8, global_seqs=2, dp_size=2)
    assert cfg.agg_kwargs() == {"global_tokens": 8, "global_seqs": 2, "dp_size": 2, "norm_constant": None}
    assert (cfg.low, cfg.high) == (0.2, 0.28)


def test_gspo_sequence_ratio_and_straight_through_gradient() -> None:
    old = torch.zeros(2, 2)
    lp = torch.tensor([[0.2, 0.4], [0.05, -0.05]], requires_grad=True)
    adv = torch.ones(2, 2)
    loss, metrics = get_policy_loss("gspo")(old, lp, adv, torch.ones(2, 2), "seq-mean-token-mean", CFG)
    # row 1: s = e^{0.3} = 1.35 clipped to 1.28; row 2: s = e^0 = 1
    assert loss.item() == pytest.approx((-1.28 - 1.0) / 2)
    assert metrics["pg_clipfrac"] == pytest.approx(0.5)
    loss.backward()
    # row 1 clipped: no gradient; row 2: each token gets -A*s / (2 tokens) / (2 sequences)
    torch.testing.assert_close(lp.grad, torch.tensor([[0.0, 0.0], [-0.25, -0.25]]))


def test_cispo_keeps_gradient_on_clipped_tokens() -> None:
    old = torch.tensor([[-1.5, -1.0]])
    lp = torch.tensor([[-1.0, -1.0]], requires_grad=True)
    adv = torch.tensor([[1.0, 2.0]])
    loss, metrics = get_policy_loss("cispo")(old, lp, adv, torch.ones(1, 2), "token-mean", CFG)
    # token 1: r = e^0.5 clipped to 1.28: -1.28 * 1 * (-1); token 2: r = 1: -1 * 2 * (-1)
    assert loss.item() == pytest.approx((1.28 + 2.0) / 2)
    assert metrics["pg_clipfrac"] == pytest.approx(0.5)
    loss.backward()
    torch.testing.assert_close(lp.grad, torch.tensor([[-1.28 / 2, -2.0 / 2]]))


def test_gpg_plain_policy_gradient() -> None:
    lp = torch.tensor([[-1.0, -2.0, -3.0]], requires_grad=True)
    adv = torch.tensor([[1.0, -1.0, 5.0]])
    loss, metrics = get_policy_loss("gpg")(lp.detach(), lp, adv, torch.tensor([[1.0, 1.0, 0.0]]))
    assert loss.item() == pytest.approx((1.0 - 2.0) / 2)
    assert metrics["ppo_kl"] == 0.0
    loss.backward()
    torch.testing.assert_close(lp.grad, torch.tensor([[-0.5, 0.5, 0.0]]))


@pytest.mark.parametrize("name", ["vanilla", "gspo", "cispo", "gpg"])
def test_empty_mask_loss_is_zero_not_nan(name: str) -> None:
    lp = torch.zeros(2, 3, requires_grad=True)
    loss, metrics = get_policy_loss(name)(torch.zeros(2, 3), lp, torch.ones(2, 3), torch.zeros(2, 3))
    assert loss.item() == 0.0
    assert not any(math.isnan(v) for v in metrics.values())


def test_value_loss_clipping() -> None:
    vpreds = torch.tensor([[1.0, 0.6]])
    values = torch.tensor([[0.5, 0.5]])
    returns = torch.tensor([[2.0, 0.0]])
    loss, metrics = value_loss(vpreds, returns, values, torch.ones(1, 2), cliprange_value=0.2)
    # token 1: clipped pred 0.7 -> (0.7-2)^2 = 1.69 > (1-2)^2 = 1; token 2: unclipped 0.36
    assert loss.item() == pytest.approx(0.5 * (1.69 + 0.36) / 2)
    assert metrics == {"vf_clipfrac": pytest.approx(0.5)}


def test_entropy_and_actor_total() -> None:
    logits = torch.zeros(1, 2, 4)
    ent = entropy_from_logits(logits)
    torch.testing.assert_close(ent, torch.full((1, 2), math.log(4)))
    peaked = torch.tensor([[[50.0, 0.0, 0.0, 0.0]]])
    assert entropy_from_logits(peaked).item() == pytest.approx(0.0, abs=1e-6)
    e = entropy_loss(ent, torch.tensor([[1.0, 0.0]]))
    assert e.item() == pytest.approx(math.log(4))
    total = actor_loss(torch.tensor(1.0), e, 0.1, torch.tensor(2.0), 0.5)
    assert total.item() == pytest.approx(1.0 - 0.1 * math.log(4) + 1.0)
    assert actor_loss(torch.tensor(1.0)).item() == 1.0


@pytest.mark.parametrize("name", ["vanilla", "gspo", "cispo", "gpg"])
@pytest.mark.parametrize(
    "mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
)
@given(seed=st.integers(0, 2**31 - 1), sizes=st.lists(st.integers(1, 3), min_size=1, max_size=4))
def test_micro_batched_gradient_equals_full_batch(name: str, mode: str, seed: int, sizes: list[int]) -> None:
    """The engine's contract end to end: per-micro-batch losses with the mini-batch totals,
    one backward each, accumulate the same gradient as one full-batch backward."""
    from rlctl.algorithms import batch_totals

    g = torch.Generator().manual_seed(seed)
    bsz, width = sum(sizes), 5
    old = -torch.rand(bsz, width, generator=g, dtype=torch.double) * 2
    lp0 = old + 0.3 * torch.randn(bsz, width, generator=g, dtype=torch.double)
    adv = torch.randn(bsz, width, generator=g, dtype=torch.double)
    mask = (torch.rand(bsz, width, generator=g) > 0.3).double()
    cfg = PolicyLossConfig(clip_ratio=0.2, clip_ratio_high=0.28, loss_agg_mode=mode)
    fn = get_policy_loss(name)

    full_lp = lp0.clone().requires_grad_(True)
    full, _ = fn(old, full_lp, adv, mask, None, cfg)
    full.backward()

    micro_cfg = cfg.with_batch(**batch_totals(mask))
    lp = lp0.clone().requires_grad_(True)
    total, start = 0.0, 0
    for size in sizes:
        rows = slice(start, start + size)
        part, _ = fn(old[rows], lp[rows], adv[rows], mask[rows], None, micro_cfg)
        part.backward()
        total += part.item()
        start += size
    assert total == pytest.approx(full.item(), rel=1e-10, abs=1e-12)
    torch.testing.assert_close(lp.grad, full_lp.grad, rtol=1e-10, atol=1e-12)
