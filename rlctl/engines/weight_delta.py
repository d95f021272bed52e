"""Delta weight pushes: per tensor, only the elements whose stored bits changed since the copy the
receiving side holds, as flat positions and values; the whole tensor where that is not smaller.

Why it pays: a rollout copy in bf16 changes only where the trainer's fp32 master crossed a bf16
rounding boundary, which at RL learning rates (Adam moves each element by about ``lr`` per step
against a bf16 step of ``|w| 2^-8``) is a few percent of the elements per step. An fp32 copy
changes nearly everywhere, so its pushes stay (almost) full.

Encoding (per tensor, the smaller of the two): index/value (int32 flat positions, 4 bytes, plus
the value in the receiving dtype: 6 bytes per changed bf16 element, so it wins below a third of the
elements changed), or the whole tensor. ``wire_bytes`` of a plan also gives the bitmask encoding's
size (one bit per element plus the changed values) for comparison; it is not sent.

Each delta carries a weighted checksum of the values it means the receiver to hold at its positions
(taken from the sender's new tensor, before anything is encoded), and :func:`apply` reads the
receiver's tensor back at those positions after writing: a wrong, lost or misplaced element of the
delta fails that push. The receiver's whole copy is still fingerprinted as after a full push.
Engines know nothing of RL: tensor arithmetic only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

INDEX_BYTES = 4  # int32 flat positions (tensors up to 2^31 elements; larger ones go whole)
_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
GOLDEN = (math.sqrt(5) - 1) / 2


@dataclass
class TensorDelta:
    """One tensor's push: ``index`` None sends ``values`` as the whole tensor."""

    name: str
    shape: tuple[int, ...]
    index: torch.Tensor | None  # int32 flat positions, ascending
    values: torch.Tensor  # in the receiving copy's dtype
    changed: int  # elements whose bits changed
    check: tuple[float, float]  # :func:`values_checksum` of the intended values at ``index``

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def wire_bytes(self) -> int:
        """Bytes this delta moves (positions plus values)."""
        idx = 0 if self.index is None else self.index.numel() * INDEX_BYTES
        return idx + self.values.numel() * self.values.element_size()

    def bitmask_bytes(self) -> int:
        """What the bitmask encoding would move: one bit per element plus the changed values."""
        return (self.numel + 7) // 8 + self.changed * self.values.element_size()


def _bits(flat: torch.Tensor) -> torch.Tensor:
    """The tensor's storage bits as integers (so NaN equals itself and -0 differs from +0)."""
    return flat.view(_INT_OF_SIZE[flat.element_size()])


def values_checksum(values: torch.Tensor, index: torch.Tensor | None = None) -> tuple[float, float]:
    """``(sum w x, sum w (|x| + 1))`` in float64, with weights in [0.5, 1.5) drawn from each value's
    flat position (``index``; the list position for a whole tensor): a value changed, moved to
    another position, or dropped changes it."""
    x = values.detach().reshape(-1).to("cpu", torch.float64)
    pos = torch.arange(x.numel()) if index is None else index.detach().reshape(-1).to("cpu")
    w = (pos.to(torch.float64) * GOLDEN).remainder(1.0) + 0.5
    return float((w * x).sum()), float((w * (x.abs() + 1.0)).sum())


def same_checksum(a: tuple[float, float], b: tuple[float, float], rtol: float = 1e-12) -> bool:
    """Equal up to float64 rounding of the same sum (the values are compared bit-exactly)."""
    return abs(a[0] - b[0]) <= rtol * max(abs(a[1]), abs(b[1]), 1e-300) or a == b


def diff(name: str, new: torch.Tensor, base: torch.Tensor) -> TensorDelta:
    """What turns ``base`` (the receiver's copy) into ``new``; both in the receiving dtype."""
    if tuple(new.shape) != tuple(base.shape) or new.dtype != base.dtype:
        raise ValueError(
            f"delta of {name!r}: new {tuple(new.shape)} {new.dtype} vs held {tuple(base.shape)} {base.dtype}"
        )
    flat_new = new.detach().reshape(-1)
    changed = _bits(flat_new) != _bits(base.detach().reshape(-1).to(flat_new.device))
    count = int(changed.sum())
    elt = flat_new.element_size()
    shape = tuple(new.shape)
    if flat_new.numel() >= 2**31 or count * (INDEX_BYTES + elt) >= flat_new.numel() * elt:
        values = flat_new.clone()
        return TensorDelta(name, shape, None, values, count, values_checksum(values))
    index = changed.nonzero().reshape(-1)
    values = flat_new[index].clone()
    return TensorDelta(name, shape, index.to(torch.int32), values, count, values_checksum(values, index))


def whole(name: str, tensor: torch.Tensor) -> TensorDelta:
    """``tensor`` sent whole (every element counted as changed)."""
    values = tensor.detach().reshape(-1).clone()
    return TensorDelta(name, tuple(tensor.shape), None, values, values.numel(), values_checksum(values))


@torch.no_grad()
def apply(target: torch.Tensor, delta: TensorDelta) -> bool:
    """Write ``delta`` into ``target`` in place, then read it back at the delta's positions;
    False when what it holds there is not what the sender meant (the push is wrong)."""
    if tuple(target.shape) != delta.shape:
        raise ValueError(f"delta of {delta.name!r} has shape {delta.shape}, the copy {tuple(target.shape)}")
    flat = target.view(-1)
    values = delta.values.to(device=target.device, dtype=target.dtype)
    if delta.index is None:
        flat.copy_(values)
        return same_checksum(values_checksum(flat), delta.check)
    index = delta.index.to(device=target.device, dtype=torch.long)
    flat.index_copy_(0, index, values)
    return same_checksum(values_checksum(flat.index_select(0, index), index), delta.check)


class Tally:
    """Running totals of a push's deltas: ``sync/bytes`` (moved), ``sync/changed_frac`` (changed
    elements over all), and what a full push in the same dtype and the bitmask encoding would move."""

    def __init__(self) -> None:
        self.moved = self.full = self.bitmask = self.changed = self.numel = 0

    def add(self, delta: TensorDelta) -> None:
        self.moved += delta.wire_bytes()
        self.full += delta.numel * delta.values.element_size()
        self.bitmask += delta.bitmask_bytes()
        self.changed += delta.changed
        self.numel += delta.numel

    def metrics(self) -> dict[str, float]:
        return {
            "sync/bytes": float(self.moved),
            "sync/changed_frac": self.changed / max(self.numel, 1),
            "sync/full_bytes": float(self.full),
            "sync/bitmask_bytes": float(self.bitmask),
        }
