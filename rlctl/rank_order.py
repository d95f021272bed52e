"""The rollout's tensor-parallel group order: which of ``world`` ranks form each TP group.

A world of ``W`` ranks at TP degree ``q`` (``W % q == 0``) holds ``W // q`` rollout replicas of
``q`` ranks. Two orders, named by the axis that varies fastest along the global rank:

* ``"contiguous"`` (what vLLM and verl launch): the TP axis is innermost, so TP group ``d`` is ranks
  ``[d*q, (d+1)*q)`` and rank ``r`` is TP rank ``r % q``.
* ``"strided"`` (HybridFlow's grouping): the TP axis is outermost, so TP group ``d`` is ranks
  ``{d, d + W/q, d + 2W/q, ...}`` and rank ``r`` is TP rank ``r // (W/q)``.

The one definition reshard (where each rank's shard goes), dispatch (which ranks share a batch) and
the engines (their TP device mesh and process groups) read, so they cannot disagree. Plain Python.
"""

from __future__ import annotations

from rlctl.errors import UserError

RANK_ORDERS = ("contiguous", "strided")


def axes(order: str) -> tuple[str, str]:
    """The rollout's two axes, ``"dp"`` and ``"tp"``, outermost first."""
    if order not in RANK_ORDERS:
        raise UserError(f"rollout rank order {order!r}; expected one of {', '.join(RANK_ORDERS)}")
    return ("dp", "tp") if order == "contiguous" else ("tp", "dp")


def _sizes(world: int, tp: int) -> dict[str, int]:
    if tp < 1 or world % tp:
        raise UserError(f"rollout tensor parallel {tp} does not divide the {world} ranks")
    return {"dp": world // tp, "tp": tp}


def coords(rank: int, world: int, tp: int, order: str) -> dict[str, int]:
    """``{"dp": replica, "tp": TP rank}`` of global ``rank``."""
    outer, inner = axes(order)
    size = _sizes(world, tp)[inner]
    return {outer: rank // size, inner: rank % size}


def tp_rank_of(rank: int, world: int, tp: int, order: str = "contiguous") -> int:
    """Rollout TP rank of global ``rank``."""
    return coords(rank, world, tp, order)["tp"]


def rank_of(replica: int, tp_rank: int, world: int, tp: int, order: str = "contiguous") -> int:
    """The global rank that is TP rank ``tp_rank`` of rollout replica ``replica``."""
    outer, inner = axes(order)
    at = {"dp": replica, "tp": tp_rank}
    return at[outer] * _sizes(world, tp)[inner] + at[inner]


def rank_grid(world: int, tp: int, order: str = "contiguous") -> list[list[int]]:
    """``grid[d][t]`` = :func:`rank_of` ``(d, t)``: row ``d`` is replica ``d``'s TP group, in TP rank order."""
    return [[rank_of(d, t, world, tp, order) for t in range(tp)] for d in range(_sizes(world, tp)["dp"])]
