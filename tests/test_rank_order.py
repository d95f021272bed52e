"""The rollout's TP group order, defined once (:mod:`rlctl.rank_order`): reshard's TP rank,
dispatch's rollout mesh and the engines' groups all read it, so they agree rank for rank."""

from __future__ import annotations

import pytest

from rlctl.dispatch.mesh import Mesh
from rlctl.errors import UserError
from rlctl.rank_order import axes, rank_grid, tp_rank_of
from rlctl.reshard import layout


@pytest.mark.parametrize(
    ("order", "grid"),
    [("contiguous", [[0, 1], [2, 3], [4, 5]]), ("strided", [[0, 3], [1, 4], [2, 5]])],
)
def test_six_ranks_at_tp2(order, grid):
    assert rank_grid(6, 2, order) == grid
    rollout = Mesh.of(None, 6).with_rollout(2, order).rollout()
    for d, row in enumerate(grid):
        for t, rank in enumerate(row):
            assert tp_rank_of(rank, 6, 2, order) == layout.tp_rank_of(rank, 6, 2, order) == t
            assert rollout.coords(rank) == {"dp": d, "tp": t}
    assert rollout.representatives() == [row[0] for row in grid]


def test_bad_orders_and_sizes_are_one_line():
    with pytest.raises(UserError, match="rank order 'diagonal'; expected one of contiguous, strided"):
        axes("diagonal")
    with pytest.raises(UserError, match="tensor parallel 4 does not divide the 6 ranks"):
        rank_grid(6, 4)
    with pytest.raises(ValueError, match="rank order 'diagonal'"):
        Mesh.of(None, 4).with_rollout(2, "diagonal")
