"""agg_loss: hand-computed modes and the exact micro-batch / data-parallel contract (hypothesis)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from rlctl.algorithms import LOSS_AGG_MODES, agg_loss, batch_totals
from rlctl.errors import UserError

LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])  # last row empty


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", 7.0 / 3.0),  # (1 + 2 + 4) / 3 tokens
        ("seq-mean-token-sum", 3.5),  # (3 + 4) / 2 non-empty sequences
        ("seq-mean-token-mean", 2.75),  # (1.5 + 4) / 2
        ("seq-mean-token-sum-norm", 3.5 / 3.0),  # / padded length 3
    ],
)
def test_modes_hand_computed(mode: str, expected: float) -> None:
    assert agg_loss(LOSS, MASK, mode).item() == pytest.approx(expected)


def test_norm_constant_and_masked_nan_do_not_leak() -> None:
    assert agg_loss(LOSS, MASK, "seq-mean-token-sum-norm", norm_constant=7.0).item() == pytest.approx(0.5)
    poisoned = LOSS.clone()
    poisoned[2, :] = float("nan")
    poisoned[0, 2] = float("inf")
    for mode in LOSS_AGG_MODES:
        assert agg_loss(poisoned, MASK, mode).item() == pytest.approx(agg_loss(LOSS, MASK, mode).item())


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_empty_mask_gives_zero_with_a_gradient_path(mode: str) -> None:
    loss = torch.ones(2, 3, requires_grad=True)
    out = agg_loss(loss, torch.zeros(2, 3), mode)
    assert out.item() == 0.0
    out.backward()
    assert torch.all(loss.grad == 0)
    out = agg_loss(loss, torch.zeros(2, 3), mode, global_tokens=5, global_seqs=2, dp_size=2)
    assert out.item() == 0.0


def test_errors() -> None:
    with pytest.raises(UserError, match="unknown loss_agg_mode 'token-sum-mean'.*token-mean"):
        agg_loss(LOSS, MASK, "token-sum-mean")
    with pytest.raises(ValueError, match="global_tokens"):
        agg_loss(LOSS, MASK, "token-mean", dp_size=2)
    with pytest.raises(ValueError, match="global_seqs"):
        agg_loss(LOSS, MASK, "seq-mean-token-mean", dp_size=2)


def test_batch_totals_counts_non_empty_sequences() -> None:
    assert batch_totals(MASK) == {"global_tokens": 3, "global_seqs": 2}


@st.composite
def _split_batches(draw):
    """A mini-batch (loss, mask with possibly empty rows) dealt to DP ranks, each cut into micro-batches."""
    bsz = draw(st.integers(1, 9))
    width = draw(st.integers(1, 6))
    lengths = draw(st.lists(st.integers(0, width), min_size=bsz, max_size=bsz))
    holes = draw(st.lists(st.booleans(), min_size=bsz * width, max_size=bsz * width))
    seed = draw(st.integers(0, 2**31 - 1))
    dp = draw(st.integers(1, 3))
    owner = draw(st.lists(st.integers(0, dp - 1), min_size=bsz, max_size=bsz))
    cuts = [draw(st.lists(st.integers(0, bsz), max_size=3)) for _ in range(dp)]
    mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).double()
    if draw(st.booleans()):  # observation-token holes inside responses (multi-turn)
        mask = mask * torch.tensor([not h for h in holes], dtype=torch.double).view(bsz, width)
    loss = torch.randn(bsz, width, generator=torch.Generator().manual_seed(seed), dtype=torch.double)
    micro = []
    for rank in range(dp):
        rows = [i for i in range(bsz) if owner[i] == rank]
        bounds = sorted({0, len(rows), *[c % (len(rows) + 1) for c in cuts[rank]]})
        micro.append([rows[a:b] for a, b in zip(bounds, bounds[1:], strict=False) if b > a])
    return loss, mask, dp, micro


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@given(case=_split_batches())
def test_micro_batch_contributions_sum_to_full_batch(mode: str, case) -> None:
    loss, mask, dp, micro = case
    full_leaf = loss.clone().requires_grad_(True)
    full = agg_loss(full_leaf, mask, mode)
    full.backward()

    totals = {"global_tokens": 0, "global_seqs": 0}
    for rank_batches in micro:
        for rows in rank_batches:
            for key, value in batch_totals(mask[rows]).items():
                totals[key] += value  # what the engine all-reduces
    leaf = loss.clone().requires_grad_(True)
    per_rank = []
    for rank_batches in micro:
        rank_sum = torch.zeros((), dtype=torch.double)
        for rows in rank_batches:  # gradient accumulation: one backward per micro-batch
            part = agg_loss(leaf[rows], mask[rows], mode, dp_size=dp, **totals)
            part.backward()
            rank_sum = rank_sum + part.detach()
        per_rank.append(rank_sum)
    # FSDP averages gradients (and hence the loss) over DP ranks
    torch.testing.assert_close(torch.stack(per_rank).sum() / dp, full.detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(leaf.grad / dp, full_leaf.grad, rtol=1e-12, atol=1e-12)
