"""The driver-side mini-batch layout: whole prompt groups, the same cut for every world size."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from rlctl.dispatch import DataProto, Dispatch, Execute, Mesh
from rlctl.dispatch.futures import execute_on_rank
from rlctl.dispatch.modes import get_mode, plan_call
from rlctl.dispatch.proto import PADDING
from rlctl.trainer.step.minibatch import (
    MINI_BATCH_ROWS,
    cut_mini_batches,
    layout_mini_batches,
    split_mini_batches,
)


def step_batch(group_sizes: list[int]) -> tuple[DataProto, np.ndarray]:
    rows = sum(group_sizes)
    uids = np.array([f"p{k}" for k, n in enumerate(group_sizes) for _ in range(n)], dtype=object)
    batch = DataProto.from_dict(
        tensors={"row": torch.arange(rows), "response_mask": torch.ones(rows, 3, dtype=torch.long)},
        meta={"step": 1},
    )
    return batch, uids


def rank_mini_batches(laid: DataProto, world: int) -> list[list[dict[str, torch.Tensor]]]:
    """What each rank's update sees: its DP shard (the real dispatch), cut at the recorded sizes."""
    payloads, _ = plan_call(
        get_mode(Dispatch.DP_COMPUTE_METRICS), Execute.ALL, Mesh.of(None, world), (laid,), {}
    )

    def on_rank(shard: DataProto):
        view = {k: shard.batch[k] for k in ("row", PADDING) if k in shard.batch}
        view.setdefault(PADDING, shard.padding_mask())
        return split_mini_batches(view, shard.meta.get(MINI_BATCH_ROWS))

    return [execute_on_rank(on_rank, *payloads[r], fetch=None) for r in range(world)]


groups = st.lists(st.integers(1, 4), min_size=1, max_size=9)


@given(groups, st.integers(0, 4), st.integers(1, 4))
def test_every_world_size_trains_the_same_rows_in_the_same_steps(group_sizes, per_mini, world):
    batch, uids = step_batch(group_sizes)
    want = [list(r) for r in cut_mini_batches(uids, len(batch), per_mini)]
    per_rank = rank_mini_batches(layout_mini_batches(batch, uids, per_mini, world), world)
    assert len({len(m) for m in per_rank}) == 1  # every rank takes the same number of steps
    for i, rows in enumerate(want):
        parts = [m[i] for m in per_rank]
        assert len({len(p["row"]) for p in parts}) == 1  # same shapes on every rank (FSDP collectives)
        real = [int(x) for p in parts for x, pad in zip(p["row"], p[PADDING], strict=True) if not pad]
        assert real == rows  # each real row exactly once, in order, in the step it belongs to
        assert sum(int(p[PADDING].sum()) for p in parts) == (-len(rows)) % world


@given(groups, st.integers(1, 4))
def test_mini_batches_hold_whole_prompt_groups(group_sizes, per_mini):
    batch, uids = step_batch(group_sizes)
    cuts = cut_mini_batches(uids, len(batch), per_mini)
    assert [r for c in cuts for r in c] == list(range(len(batch)))
    for c in cuts:
        assert len(set(uids[list(c)])) <= per_mini
        assert c.start == 0 or uids[c.start] != uids[c.start - 1]  # never inside a group
    assert len(cuts) == -(-len(group_sizes) // per_mini)


def test_the_issue_case_takes_one_step_per_prompt_on_two_ranks():
    """8 prompts x 3 samples, one prompt per mini-batch, 2 ranks: 8 optimiser steps (was 6)."""
    batch, uids = step_batch([3] * 8)
    per_rank = rank_mini_batches(layout_mini_batches(batch, uids, 1, 2), 2)
    assert [len(m) for m in per_rank] == [8, 8]
    assert [len(mb["row"]) for mb in per_rank[1]] == [2] * 8  # 3 rows + 1 padding row per step


def test_one_rank_and_one_mini_batch_leave_the_batch_as_it_was():
    batch, uids = step_batch([4] * 6)
    laid = layout_mini_batches(batch, uids, 0, 1)
    assert (
        laid.without_padding_column()
        .select(list(batch.batch))
        .equals(DataProto(batch.batch, meta={**batch.meta, MINI_BATCH_ROWS: [24]}))
    )
    assert PADDING not in laid.batch


def test_padding_rows_are_copies_of_real_rows_marked_as_padding():
    batch, uids = step_batch([2, 2, 3])  # 7 rows on 2 ranks
    laid = layout_mini_batches(batch, uids, 0, 2)
    assert len(laid) == 8 and laid.meta[MINI_BATCH_ROWS] == [4]
    assert laid[PADDING].tolist() == [False] * 7 + [True]
    assert laid["row"].tolist() == list(range(7)) + [0]


def test_split_rejects_sizes_that_do_not_cut_the_shard():
    with pytest.raises(ValueError, match="mini_batch_rows"):
        split_mini_batches({"x": torch.zeros(5)}, [2, 2])
    assert [len(m["x"]) for m in split_mini_batches({"x": torch.zeros(5)}, None)] == [5]


def test_workers_zero_the_response_mask_of_padding_rows():
    from rlctl.trainer.workers.roles import _train_view

    batch, uids = step_batch([2, 2, 3])
    view = _train_view(layout_mini_batches(batch, uids, 0, 2))
    assert view["response_mask"].sum(-1).tolist() == [3] * 7 + [0]
    assert PADDING not in view  # the engine gets only its own tensors
