"""Hand-computed cases for every advantage estimator, including the edge cases."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rlctl.algorithms import get_adv_estimator, group_stats
from rlctl.algorithms.advantages import group_ids


def _outcome(scores: list[float], lengths: list[int], width: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    """Outcome rewards on each response's last valid token, and the response mask."""
    mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).float()
    rewards = torch.zeros(len(scores), width)
    for i, (s, n) in enumerate(zip(scores, lengths, strict=True)):
        if n:
            rewards[i, n - 1] = s
    return rewards, mask


def _per_seq(adv: torch.Tensor, mask: torch.Tensor) -> list[float]:
    """The scalar each row carries (checking it is constant over that row's mask and 0 elsewhere)."""
    out = []
    for row, m in zip(adv, mask, strict=True):
        assert torch.all(row[m == 0] == 0)
        vals = row[m == 1]
        out.append(float(vals[0]) if len(vals) else 0.0)
        assert torch.allclose(vals, vals[:1].expand_as(vals)) if len(vals) else True
    return out


# groups: A = 4 samples [1, 0, 1, 0]; B = 2 samples all equal [1, 1]; C = a group of one [2]
SCORES = [1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 2.0]
LENGTHS = [3, 1, 2, 3, 2, 3, 1]
INDEX = np.array(["A", "A", "A", "A", "B", "B", "C"], dtype=object)


def test_grpo_hand_computed() -> None:
    rewards, mask = _outcome(SCORES, LENGTHS)
    adv, ret = get_adv_estimator("grpo")(token_level_rewards=rewards, response_mask=mask, index=INDEX)
    std_a = math.sqrt(4 * 0.25 / 3)  # unbiased std of [1, 0, 1, 0]
    z = 0.5 / (std_a + 1e-6)
    expected = [z, -z, z, -z, 0.0, 0.0, 2.0 / (1 + 1e-6)]  # all-equal -> 0; group of one keeps its score
    assert _per_seq(adv, mask) == pytest.approx(expected, rel=1e-6)
    assert torch.equal(adv, ret)


def test_dr_grpo_is_mean_only() -> None:
    rewards, mask = _outcome(SCORES, LENGTHS)
    adv, _ = get_adv_estimator("grpo")(rewards, mask, index=INDEX, norm_adv_by_std_in_grpo=False)
    assert _per_seq(adv, mask) == pytest.approx([0.5, -0.5, 0.5, -0.5, 0.0, 0.0, 2.0])


def test_grpo_flag_can_come_from_config() -> None:
    rewards, mask = _outcome(SCORES, LENGTHS)
    adv, _ = get_adv_estimator("grpo")(rewards, mask, index=INDEX, config={"norm_adv_by_std_in_grpo": False})
    assert _per_seq(adv, mask)[0] == pytest.approx(0.5)


def test_grpo_empty_rows_and_empty_batch_give_zeros() -> None:
    rewards, mask = _outcome([1.0, 0.0, 1.0], [0, 2, 0])
    adv, _ = get_adv_estimator("grpo")(rewards, mask, index=[0, 0, 0])
    assert torch.all(adv[0] == 0) and torch.all(adv[2] == 0)
    rewards, mask = _outcome([0.0, 0.0], [0, 0])
    adv, _ = get_adv_estimator("grpo")(rewards, mask, index=[0, 0])
    assert torch.all(adv == 0) and not torch.isnan(adv).any()


@pytest.mark.parametrize(
    "index",
    [
        np.array(["u1", "u1", "u2", "u2"], dtype=object),
        [7, 7, 3, 3],
        torch.tensor([7, 7, 3, 3]),
        np.array([7, 7, 3, 3]),
    ],
)
def test_index_forms_give_the_same_groups(index) -> None:
    rewards, mask = _outcome([1.0, 0.0, 3.0, 1.0], [1, 1, 1, 1])
    adv, _ = get_adv_estimator("grpo")(rewards, mask, index=index, norm_adv_by_std_in_grpo=False)
    assert _per_seq(adv, mask) == pytest.approx([0.5, -0.5, 1.0, -1.0])


def test_group_ids_errors() -> None:
    with pytest.raises(ValueError, match="index"):
        group_ids(None, 3)
    with pytest.raises(ValueError, match="2 labels for a batch of 3"):
        group_ids([1, 2], 3)


def test_group_stats_unbiased_and_singletons() -> None:
    mean, std, n = group_stats(torch.tensor([1.0, 3.0, 5.0, 10.0]), ["a", "a", "a", "b"])
    assert mean.tolist() == [3.0, 3.0, 3.0, 0.0]
    assert std.tolist() == pytest.approx([2.0, 2.0, 2.0, 1.0])  # sqrt(8/2) = 2 (Bessel)
    assert n.tolist() == [3, 3, 3, 1]


def test_rloo_hand_computed() -> None:
    rewards, mask = _outcome([1.0, 0.0, 0.0, 3.0, 2.0, 2.0], [1, 2, 3, 3, 1, 1])
    adv, ret = get_adv_estimator("rloo")(rewards, mask, index=["g", "g", "g", "solo", "h", "h"])
    # leave-one-out: 1 - mean(0, 0) = 1; 0 - mean(1, 0) = -0.5; a group of one keeps its raw score
    assert _per_seq(adv, mask) == pytest.approx([1.0, -0.5, -0.5, 3.0, 0.0, 0.0])
    assert torch.equal(adv, ret)


def test_opo_length_weighted_baseline() -> None:
    rewards, mask = _outcome([1.0, 0.0, 5.0], [3, 1, 2])
    adv, _ = get_adv_estimator("opo")(rewards, mask, index=["g", "g", "solo"])
    # baseline = (3*1 + 1*0) / 4 = 0.75; a group of one has baseline 0
    assert _per_seq(adv, mask) == pytest.approx([0.25, -0.75, 5.0])


def test_opo_all_empty_group_is_not_nan() -> None:
    rewards, mask = _outcome([0.0, 0.0], [0, 0])
    adv, _ = get_adv_estimator("opo")(rewards, mask, index=["g", "g"])
    assert torch.all(adv == 0)


def test_gpg_alpha_and_f_norm() -> None:
    rewards, mask = _outcome([1.0, 0.0, 1.0, 0.0], [1, 2, 3, 1])
    est = get_adv_estimator("gpg")
    adv, _ = est(rewards, mask, index=[0, 0, 0, 0])  # alpha = 4 / 2 nonzero = 2
    assert _per_seq(adv, mask) == pytest.approx([1.0, -1.0, 1.0, -1.0])
    adv, _ = est(rewards, mask, index=[0, 0, 0, 0], f_norm=2.0, alpha=123.0)  # alpha is overwritten
    assert _per_seq(adv, mask) == pytest.approx([0.5, -0.5, 0.5, -0.5])
    zero, _ = _outcome([0.0, 0.0], [1, 1])
    adv, _ = est(zero, mask[:2], index=[0, 0])
    assert torch.all(adv == 0)


def test_reinforce_pp_baseline_whitens_over_batch() -> None:
    rewards, mask = _outcome([1.0, 0.0, 2.0, 2.0], [1, 1, 1, 1])
    adv, _ = get_adv_estimator("reinforce_plus_plus_baseline")(rewards, mask, index=["a", "a", "b", "b"])
    # centred [0.5, -0.5, 0, 0]; batch mean 0, unbiased var = 0.5 / 3
    z = 0.5 / math.sqrt(0.5 / 3 + 1e-8)
    assert _per_seq(adv, mask) == pytest.approx([z, -z, 0.0, 0.0], rel=1e-6)


def test_reinforce_pp_discounts_and_skips_masked_tokens() -> None:
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0], [0.0, 0.0, 1.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [1.0, 0.0, 1.0]])
    adv, ret = get_adv_estimator("reinforce_plus_plus")(rewards, mask, gamma=0.5)
    # row 3: the masked middle token carries the return through without discounting it
    expected = torch.tensor([[0.25, 0.5, 1.0], [1.0, 2.0, 0.0], [0.5, 0.0, 1.0]])
    torch.testing.assert_close(ret, expected)
    valid = expected[mask == 1].numpy().astype(np.float64)
    z = (valid - valid.mean()) / math.sqrt(valid.var(ddof=1) + 1e-8)
    torch.testing.assert_close(adv[mask == 1], torch.tensor(z, dtype=torch.float32))
    assert torch.all(adv[mask == 0] == 0)
    _, ret_cfg = get_adv_estimator("reinforce_plus_plus")(rewards, mask, config={"gamma": 0.5})
    torch.testing.assert_close(ret_cfg, expected)


def test_gae_hand_computed() -> None:
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 1.0]])
    values = torch.tensor([[0.5, 0.6, 0.7], [0.5, 0.6, 0.7]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 1.0]])
    adv, ret = get_adv_estimator("gae")(rewards, values, mask, gamma=0.9, lam=0.8)
    # row 1: deltas [0.04, 0.03, 0.3]; A = [0.04 + 0.72*0.246, 0.03 + 0.72*0.3, 0.3]
    # row 2: the masked middle token is skipped: A0 = (0.9*0.7 - 0.5) + 0.72*0.3, A1 carries A2
    raw = torch.tensor([[0.21712, 0.246, 0.3], [0.346, 0.3, 0.3]])
    torch.testing.assert_close(ret, raw + values)
    valid = raw[mask == 1].double()
    z = (valid - valid.mean()) / math.sqrt(valid.var(unbiased=True).item() + 1e-8)
    torch.testing.assert_close(adv[mask == 1], z.float(), rtol=1e-5, atol=1e-5)


def test_gae_gamma_lam_one_is_return_minus_value() -> None:
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    values = torch.tensor([[0.5, 0.6, 0.7]])
    adv, ret = get_adv_estimator("gae")(rewards, values, torch.ones(1, 3), config={"gamma": 1.0, "lam": 1.0})
    torch.testing.assert_close(ret, torch.ones(1, 3))
    torch.testing.assert_close(adv, torch.tensor([[1.0, 0.0, -1.0]]), rtol=1e-4, atol=1e-4)


def test_whitening_estimators_need_two_valid_tokens() -> None:
    rewards, mask = _outcome([1.0, 0.0], [1, 0])
    with pytest.raises(ValueError, match="one element"):
        get_adv_estimator("gae")(rewards, torch.zeros_like(rewards), mask)
    with pytest.raises(ValueError, match="no element"):
        get_adv_estimator("reinforce_plus_plus")(rewards, torch.zeros_like(mask))


def test_remax_hand_computed() -> None:
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv, ret = get_adv_estimator("remax")(rewards, torch.tensor([0.5, 1.0]), mask)
    torch.testing.assert_close(ret, torch.tensor([[1.0, 1.0, 1.0], [2.0, 2.0, 0.0]]))
    torch.testing.assert_close(adv, torch.tensor([[0.5, 0.5, 0.5], [1.0, 1.0, 0.0]]))


@pytest.mark.parametrize("name", ["grpo", "rloo", "opo", "gpg", "reinforce_plus_plus_baseline"])
def test_estimators_accept_the_uniform_kwarg_bag_and_no_grad(name: str) -> None:
    rewards, mask = _outcome(SCORES, LENGTHS)
    rewards.requires_grad_(True)
    bag = {
        "token_level_rewards": rewards,
        "response_mask": mask,
        "index": INDEX,
        "values": torch.zeros_like(mask),
        "reward_baselines": torch.zeros(len(SCORES)),
        "gamma": 1.0,
        "lam": 1.0,
        "config": None,
    }
    adv, ret = get_adv_estimator(name)(**bag)
    assert adv.shape == ret.shape == mask.shape
    assert not adv.requires_grad


def test_masked_helpers_accept_verl_axis_keyword() -> None:
    from rlctl.algorithms import masked_mean, masked_sum

    x = torch.tensor([[1.0, 3.0], [5.0, 7.0]])
    m = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    assert masked_sum(x, m, axis=-1).tolist() == [1.0, 12.0]
    torch.testing.assert_close(masked_mean(x, m, axis=-1), torch.tensor([1.0, 6.0]))
    torch.testing.assert_close(masked_mean(x, m), torch.tensor(13.0 / 3))


@pytest.mark.parametrize("name", ["grpo", "rloo", "gpg"])
@pytest.mark.parametrize("value", [0.7, 0.1, 1 / 3, -2.3])
def test_equal_rewards_not_exactly_representable_give_exactly_zero(name: str, value: float) -> None:
    """Sixteen equal scores that float32 cannot hold exactly: rounding in the group mean must not
    turn into an advantage (verl's float32 mean gives |adv| up to 0.056 for sixteen 0.7s)."""
    rewards, mask = _outcome([value] * 16 + [1.0, 0.0], [3] * 18)
    index = np.array(["g"] * 16 + ["h", "h"], dtype=object)
    adv, _ = get_adv_estimator(name)(token_level_rewards=rewards, response_mask=mask, index=index)
    assert torch.equal(adv[:16], torch.zeros_like(adv[:16]))
    assert adv[16:].abs().sum() > 0


def test_group_stats_of_equal_scores_are_exact() -> None:
    scores = torch.full((16,), 0.7)
    mean, std, count = group_stats(scores, ["g"] * 16)
    assert torch.equal(mean, scores) and torch.equal(std, torch.zeros(16)) and count[0] == 16
