"""Rollout-correction importance weights and the DAPO helpers, hand-computed."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rlctl.algorithms import groups_with_variance, overlong_penalty, rollout_is_weights
from rlctl.errors import UserError

OLD = torch.zeros(1, 3)
ROLLOUT = torch.tensor([[-1.0, 0.0, 1.0]])  # token ratios e, 1, 1/e
E = math.e


def test_token_truncate() -> None:
    w, m = rollout_is_weights(OLD, ROLLOUT, torch.ones(1, 3), level="token", mode="truncate", threshold=2.0)
    torch.testing.assert_close(w, torch.tensor([[2.0, 1.0, 1 / E]]))
    assert m["rollout_is_ratio_fraction_high"] == pytest.approx(1 / 3)
    assert m["rollout_is_ratio_fraction_low"] == pytest.approx(1 / 3)  # 1/e < default lower 1/2
    assert m["rollout_is_max"] == 2.0
    assert m["kl"] == pytest.approx(0.0)
    assert not w.requires_grad


def test_token_mask_mode_zeroes_out_of_bounds() -> None:
    w, m = rollout_is_weights(OLD, ROLLOUT, torch.ones(1, 3), mode="mask", threshold=2.0)
    torch.testing.assert_close(w, torch.tensor([[0.0, 1.0, 0.0]]))
    assert m["rollout_is_oob_ratio"] == pytest.approx(2 / 3)
    w, _ = rollout_is_weights(OLD, ROLLOUT, torch.ones(1, 3), mode="mask", threshold=3.0, threshold_lower=0.3)
    torch.testing.assert_close(w, torch.tensor([[E, 1.0, 1 / E]]))


def test_sequence_level_uses_masked_product() -> None:
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    old, rollout = OLD.expand(2, 3), ROLLOUT.expand(2, 3)
    w, _ = rollout_is_weights(old, rollout, mask, level="sequence", threshold=2.0)
    # row 1: e * 1 / e = 1; row 2: e * 1 = e, truncated to 2; padding gets 0
    torch.testing.assert_close(w, torch.tensor([[1.0, 1.0, 1.0], [2.0, 2.0, 0.0]]))
    w, _ = rollout_is_weights(old, rollout, mask, level="sequence", mode="mask", threshold=2.0)
    torch.testing.assert_close(w, torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]))


def test_empty_mask_and_bad_arguments() -> None:
    w, m = rollout_is_weights(OLD, ROLLOUT, torch.zeros(1, 3))
    assert torch.all(w == 0) and not any(math.isnan(v) for v in m.values())
    with pytest.raises(UserError, match="level = 'batch'"):
        rollout_is_weights(OLD, ROLLOUT, torch.ones(1, 3), level="batch")
    with pytest.raises(UserError, match="mode = 'clip'"):
        rollout_is_weights(OLD, ROLLOUT, torch.ones(1, 3), mode="clip")
    with pytest.raises(UserError, match="threshold_lower = 3.0"):
        rollout_is_weights(OLD, ROLLOUT, torch.ones(1, 3), threshold=2.0, threshold_lower=3.0)
    with pytest.raises(ValueError, match="shapes differ"):
        rollout_is_weights(OLD, ROLLOUT, torch.ones(1, 2))


def test_overlong_penalty() -> None:
    lengths = torch.tensor([10, 16, 18, 20, 22])
    out = overlong_penalty(lengths, max_len=20, buffer_len=4, penalty_factor=1.0)
    torch.testing.assert_close(out, torch.tensor([0.0, 0.0, -0.5, -1.0, -1.5]))
    torch.testing.assert_close(overlong_penalty([18], 20, 4, penalty_factor=2.0), torch.tensor([-1.0]))
    with pytest.raises(UserError, match="overlong_buffer.len = 0"):
        overlong_penalty(lengths, 20, 0)
    with pytest.raises(UserError, match="must not exceed"):
        overlong_penalty(lengths, 20, 30)


def test_groups_with_variance() -> None:
    scores = np.array([1.0, 1.0, 0.0, 2.0, 2.0, 5.0])
    index = np.array(["a", "a", "a", "b", "b", "c"], dtype=object)
    keep = groups_with_variance(scores, index)
    assert keep.tolist() == [True, True, True, False, False, True]  # singleton kept, as verl
    keep = groups_with_variance(torch.tensor(scores), index, keep_singletons=False)
    assert keep.tolist() == [True, True, True, False, False, False]
