"""Named device mesh of a worker group: rank <-> coordinates, DP size, DP representatives.

Ranks are laid out row-major over the axes in the order given, so ``{"dp": 2, "tp": 2}`` puts the
two TP ranks of one DP group next to each other (ranks 0,1 = dp 0; ranks 2,3 = dp 1), which is what
keeps TP groups inside one node. The axis named ``"dp"`` is the data-parallel one; a mesh without
it has a DP size of 1 (every rank sees the whole batch).

A group whose ranks also hold a tensor-parallel rollout engine carries its rollout layout
(``rollout_tp`` ranks a replica, TP groups ``contiguous`` or ``strided``): :meth:`Mesh.rollout`
is the mesh generation is dispatched over (one batch share per replica, the same share to each TP
rank of it, one answer collected per replica), while every other stage keeps the group's mesh.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from rlctl import rank_order

DP_AXIS = "dp"


@dataclass(frozen=True)
class Mesh:
    """An ordered named shape such as ``(("dp", 2), ("tp", 2))``."""

    shape: tuple[tuple[str, int], ...]
    rollout_tp: int = 1
    rollout_order: str = "contiguous"

    @classmethod
    def of(cls, spec: Mapping[str, int] | Mesh | None, world_size: int) -> Mesh:
        """Build and check a mesh for ``world_size`` ranks; ``None`` means pure DP."""
        if isinstance(spec, Mesh):
            mesh = spec
        elif spec is None:
            mesh = cls(((DP_AXIS, world_size),))
        else:
            mesh = cls(tuple((str(k), int(v)) for k, v in spec.items()))
        names = [n for n, _ in mesh.shape]
        if len(set(names)) != len(names) or not names:
            raise ValueError(f"mesh {dict(mesh.shape)} needs at least one axis and unique axis names")
        if any(size < 1 for _, size in mesh.shape):
            raise ValueError(f"mesh {dict(mesh.shape)} has an axis of size < 1")
        if mesh.world_size != world_size:
            raise ValueError(
                f"mesh {dict(mesh.shape)} has {mesh.world_size} ranks but the resource pool has {world_size}"
            )
        return mesh

    @property
    def world_size(self) -> int:
        return math.prod(size for _, size in self.shape)

    @property
    def axes(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.shape)

    def size(self, axis: str) -> int:
        return dict(self.shape).get(axis, 1)

    @property
    def dp_size(self) -> int:
        return self.size(DP_AXIS)

    def coords(self, rank: int) -> dict[str, int]:
        """Coordinates of ``rank``, e.g. ``{"dp": 1, "tp": 0}``."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} outside a mesh of {self.world_size}")
        out: dict[str, int] = {}
        for name, size in reversed(self.shape):
            out[name] = rank % size
            rank //= size
        return {n: out[n] for n in self.axes}

    def rank_of(self, coords: Mapping[str, int]) -> int:
        """Inverse of ``coords``; axes left out are 0."""
        rank = 0
        for name, size in self.shape:
            rank = rank * size + coords.get(name, 0)
        return rank

    def dp_rank(self, rank: int) -> int:
        return self.coords(rank).get(DP_AXIS, 0)

    def representatives(self) -> list[int]:
        """One rank per DP group (all other coordinates 0), in DP order: whose outputs are collected."""
        return [self.rank_of({DP_AXIS: d}) for d in range(self.dp_size)]

    def as_dict(self) -> dict[str, int]:
        return dict(self.shape)

    def with_rollout(self, tp: int, order: str = "contiguous") -> Mesh:
        """This mesh with a rollout layout of ``tp`` ranks a replica (``contiguous`` TP groups
        ``[d*tp, (d+1)*tp)``, or ``strided`` ``{d, d+dp, ...}``)."""
        if tp < 1 or self.world_size % tp:
            raise ValueError(
                f"rollout tensor-parallel {tp} does not divide the mesh's {self.world_size} ranks"
            )
        if order not in rank_order.RANK_ORDERS:
            raise ValueError(f"rollout rank order {order!r}; expected one of {', '.join(rank_order.RANK_ORDERS)}")
        return Mesh(self.shape, tp, order)

    def rollout(self) -> Mesh:
        """The mesh generation runs over: ``world / rollout_tp`` DP replicas of ``rollout_tp`` TP
        ranks, laid out in the rollout order (:func:`rlctl.rank_order.axes`: strided = the TP axis
        outermost)."""
        dp = self.world_size // self.rollout_tp
        if self.rollout_tp == 1:
            return Mesh(((DP_AXIS, dp),))
        sizes = {DP_AXIS: dp, "tp": self.rollout_tp}
        return Mesh(tuple((axis, sizes[axis]) for axis in rank_order.axes(self.rollout_order)))
