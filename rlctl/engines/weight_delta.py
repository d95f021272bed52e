"""Delta weight pushes: per tensor, only the elements whose stored bits changed since the copy the
receiving side holds; the whole tensor where that is not smaller.

Why it pays: a rollout copy in bf16 changes only where the trainer's fp32 master crossed a bf16
rounding boundary, which at RL learning rates (Adam moves each element by about ``lr`` per step
against a bf16 step of ``|w| 2^-8``) is a few percent of the elements per step. An fp32 copy
changes nearly everywhere, so its pushes stay (almost) full.

Encoding, per tensor the smallest of (sizes for ``c`` changed elements of ``n``, ``e`` bytes each):

- whole: ``n e``;
- positions as int32 indices (``4 c``) or as a bitmask (``n / 8``: cheaper above 1/32 changed);
- values as the new values (``c e``) or, where every change is within 127 representable values of
  the stored one (a bf16 element an update moved is nearly always one away), as int8 steps in the
  floats' order (``c``; zero crossings included), added to the receiver's copy.

A bf16 tensor with 7% of its elements changed moves 1/16 + 0.07/2 = 9.9% of its bytes as bitmask
plus steps, against 21% as index/value (docs/async-rollouts.md has SmolLM2's numbers).

Each delta carries a weighted checksum of the values it means the receiver to hold and of their
positions (taken from the sender's new tensor, before anything is encoded), and :func:`apply` reads
the receiver's tensor back at those positions after writing: a wrong, lost or misplaced element,
or a receiver whose copy was not the sender's base, fails that push. The receiver's whole copy is
still fingerprinted as after a full push. Engines know nothing of RL: tensor arithmetic only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

INDEX_BYTES = 4  # int32 flat positions (tensors up to 2^31 elements; larger ones go whole)
_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
GOLDEN = (math.sqrt(5) - 1) / 2
_SHIFTS = torch.arange(8, dtype=torch.uint8)


@dataclass
class TensorDelta:
    """One tensor's push. Positions: ``index`` (int32), or ``mask`` (packed bits), or neither (the
    whole tensor). ``values``: the new values in the receiving dtype, or with ``steps`` int8
    differences of the stored bit patterns."""

    name: str
    shape: tuple[int, ...]
    index: torch.Tensor | None
    values: torch.Tensor
    changed: int  # elements whose bits changed
    check: tuple[float, float]  # :func:`values_checksum` of the intended values at their positions
    mask: torch.Tensor | None = None  # uint8, bit i of byte j = element 8 j + i changed
    steps: bool = False
    element_size: int = 2  # of the receiving dtype (what a full push moves per element)
    # with ``steps``: the changes too far for an int8 step (elements near zero), as index/value
    extra_index: torch.Tensor | None = None
    extra_values: torch.Tensor | None = None

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def encoding(self) -> str:
        where = "index" if self.index is not None else "bitmask" if self.mask is not None else "whole"
        return where if where == "whole" else f"{where}+{'steps' if self.steps else 'values'}"

    def wire_bytes(self) -> int:
        """Bytes this delta moves (positions plus values)."""
        idx = 0 if self.index is None else self.index.numel() * INDEX_BYTES
        bits = 0 if self.mask is None else self.mask.numel()
        extra = 0
        if self.extra_index is not None and self.extra_values is not None:
            extra = self.extra_index.numel() * INDEX_BYTES + self.extra_values.numel() * self.element_size
        return idx + bits + self.values.numel() * self.values.element_size() + extra

    def index_value_bytes(self) -> int:
        """What the plain index/value encoding would move (for comparison)."""
        return self.changed * (INDEX_BYTES + self.element_size)


def _bits(flat: torch.Tensor) -> torch.Tensor:
    """The tensor's storage bits as integers (so NaN equals itself and -0 differs from +0)."""
    return flat.view(_INT_OF_SIZE[flat.element_size()])


def _ordered(bits: torch.Tensor) -> torch.Tensor:
    """Float bit patterns (as signed integers) -> int64 keys in the floats' order, consecutive for
    neighbouring floats, so a step across zero is small too (-0 and +0 stay distinct: -1 and 0)."""
    width = bits.element_size() * 8
    u = bits.to(torch.int64) & ((1 << width) - 1)
    sign = 1 << (width - 1)
    return torch.where(u < sign, u, sign - 1 - u)


def _from_ordered(key: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The inverse of :func:`_ordered`, as the signed integer type ``dtype``."""
    width = torch.iinfo(dtype).bits
    sign = 1 << (width - 1)
    u = torch.where(key >= 0, key, sign - 1 - key)
    return torch.where(u >= sign, u - (1 << width), u).to(dtype)


def pack_mask(changed: torch.Tensor) -> torch.Tensor:
    """A bool vector as packed uint8 bits (little-endian within a byte)."""
    pad = (-changed.numel()) % 8
    padded = torch.cat([changed, changed.new_zeros(pad)]) if pad else changed
    shifts = _SHIFTS.to(changed.device)
    return (padded.view(-1, 8).to(torch.uint8) << shifts).sum(1, dtype=torch.uint8)


def unpack_positions(mask: torch.Tensor, numel: int) -> torch.Tensor:
    """The ascending flat positions whose bit is set in ``mask``."""
    shifts = _SHIFTS.to(mask.device)
    bits = ((mask[:, None] >> shifts) & 1).view(-1)[:numel]
    return bits.nonzero().reshape(-1)


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


def whole(name: str, tensor: torch.Tensor) -> TensorDelta:
    """``tensor`` sent whole (every element counted as changed)."""
    values = tensor.detach().reshape(-1).clone()
    n, elt = values.numel(), values.element_size()
    return TensorDelta(name, tuple(tensor.shape), None, values, n, values_checksum(values), element_size=elt)


def diff(name: str, new: torch.Tensor, base: torch.Tensor) -> TensorDelta:
    """What turns ``base`` (the receiver's copy) into ``new``, in the smallest encoding; both in
    the receiving dtype."""
    if tuple(new.shape) != tuple(base.shape) or new.dtype != base.dtype:
        raise ValueError(
            f"delta of {name!r}: new {tuple(new.shape)} {new.dtype} vs held {tuple(base.shape)} {base.dtype}"
        )
    flat_new = new.detach().reshape(-1)
    new_bits, old_bits = _bits(flat_new), _bits(base.detach().reshape(-1).to(flat_new.device))
    changed = new_bits != old_bits
    count, numel, elt = int(changed.sum()), flat_new.numel(), flat_new.element_size()
    index = changed.nonzero().reshape(-1)
    step, far = None, index[:0]
    if elt <= 4 and count:
        step = _ordered(new_bits[index]) - _ordered(old_bits[index])
        near = step.abs() <= 127
        far, index, step, changed = index[~near], index[near], step[near].to(torch.int8), changed.clone()
        changed[far] = False
    far_bytes = far.numel() * (INDEX_BYTES + elt)
    sizes = {
        "whole": numel * elt,
        "index": count * (INDEX_BYTES + elt),
        "bitmask": (numel + 7) // 8 + count * elt,
    }
    if step is not None:
        sizes["index+steps"] = index.numel() * (INDEX_BYTES + 1) + far_bytes
        sizes["bitmask+steps"] = (numel + 7) // 8 + index.numel() + far_bytes
    best = min(sizes, key=sizes.get)
    shape = tuple(new.shape)
    if best == "whole" or numel >= 2**31:
        return TensorDelta(
            name, shape, None, flat_new.clone(), count, values_checksum(flat_new), element_size=elt
        )
    if not best.endswith("+steps"):  # every change as its value
        index = (new_bits != old_bits).nonzero().reshape(-1)
        values = flat_new[index].clone()
        return TensorDelta(
            name,
            shape,
            index.to(torch.int32) if best == "index" else None,
            values,
            count,
            values_checksum(values, index),
            mask=pack_mask(new_bits != old_bits) if best == "bitmask" else None,
            element_size=elt,
        )
    every = torch.cat([index, far])
    return TensorDelta(
        name,
        shape,
        index.to(torch.int32) if best == "index+steps" else None,
        step,
        count,
        values_checksum(flat_new[every], every),
        mask=pack_mask(changed) if best == "bitmask+steps" else None,
        steps=True,
        element_size=elt,
        extra_index=far.to(torch.int32),
        extra_values=flat_new[far].clone(),
    )


def positions(delta: TensorDelta, device: torch.device | str = "cpu") -> torch.Tensor | None:
    """The delta's flat positions (None: the whole tensor)."""
    if delta.index is not None:
        return delta.index.to(device=device, dtype=torch.long)
    if delta.mask is not None:
        return unpack_positions(delta.mask.to(device), delta.numel)
    return None


@torch.no_grad()
def apply(target: torch.Tensor, delta: TensorDelta) -> bool:
    """Write ``delta`` into ``target`` in place, then read it back at the delta's positions;
    False when what it holds there is not what the sender meant (the push is wrong)."""
    if tuple(target.shape) != delta.shape:
        raise ValueError(f"delta of {delta.name!r} has shape {delta.shape}, the copy {tuple(target.shape)}")
    flat = target.view(-1)
    index = positions(delta, target.device)
    if index is None:
        flat.copy_(delta.values.to(device=target.device, dtype=target.dtype))
        return same_checksum(values_checksum(flat), delta.check)
    if index.numel() != delta.values.numel():
        return False
    if not delta.steps:
        flat.index_copy_(0, index, delta.values.to(device=target.device, dtype=target.dtype))
        return same_checksum(values_checksum(flat.index_select(0, index), index), delta.check)
    bits = _bits(flat)
    moved = _ordered(bits.index_select(0, index)) + delta.values.to(target.device, torch.int64)
    bits.index_copy_(0, index, _from_ordered(moved, bits.dtype))
    far = delta.extra_index.to(device=target.device, dtype=torch.long)
    flat.index_copy_(0, far, delta.extra_values.to(device=target.device, dtype=target.dtype))
    every = torch.cat([index, far])
    return same_checksum(values_checksum(flat.index_select(0, every), every), delta.check)


class Tally:
    """Running totals of a push's deltas: ``sync/bytes`` (moved), ``sync/changed_frac`` (changed
    elements over all), and what a full push in the same dtype and plain index/value would move."""

    def __init__(self) -> None:
        self.moved = self.full = self.index_value = self.changed = self.numel = 0

    def add(self, delta: TensorDelta) -> None:
        self.moved += delta.wire_bytes()
        self.full += delta.numel * delta.element_size
        self.index_value += min(delta.index_value_bytes(), delta.numel * delta.element_size)
        self.changed += delta.changed
        self.numel += delta.numel

    def metrics(self) -> dict[str, float]:
        return {
            "sync/bytes": float(self.moved),
            "sync/changed_frac": self.changed / max(self.numel, 1),
            "sync/full_bytes": float(self.full),
            "sync/index_value_bytes": float(self.index_value),
        }
