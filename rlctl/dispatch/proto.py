"""DataProto: the logical batch that crosses the driver / worker-group boundary.

A DataProto is named tensors (``batch``, all with the same first dimension), named non-tensor
columns (``non_tensor``, numpy arrays of the same length, usually ``dtype=object`` for strings and
dicts) and free-form ``meta``. Rows are samples; every row operation (index, chunk, concat, repeat,
pad) applies to tensors and non-tensor columns together.

Why hand code instead of tensordict: tensordict (0.15 here) would only hold the tensor half; the
non-tensor columns, the conflict-checked ``union``, interleaved ``repeat`` and pad/unpad would
still be ours, its import costs ~2 s per worker process, and it is one more compiled package whose
build must track torch on every accelerator box (the in-process GPU path runs where only torch is
installed). What is left is ~250 lines of plain torch/numpy.

Pickling is cheap: CPU tensors are pickled as numpy views of their own bytes (never the whole
storage a sliced view points into), so with pickle protocol 5 (Ray) the bytes travel out of band
and are copied once into the object store. Unpickled tensors own fresh writable memory: a
zero-copy alias of Ray's shared, immutable object store would let an in-place op corrupt it.

Padding rows. Rows that exist only to make shapes divide (a DP split, a mini-batch spread over
ranks) are copies of real rows; a bool tensor column ``PADDING`` (``"is_padding"``) marks them so
a worker can keep them out of every loss, count and metric. The dispatch layer adds it, knowing
nothing of what the rows mean; ``padding_mask()`` reads it (all False when absent).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from rlctl.dispatch.tensors import _BORROW, borrowing, cat_rows, pack_tensor, unpack_tensor

__all__ = ["PADDING", "DataProto", "borrowing"]

PADDING = "is_padding"  # bool column: True on rows added only to make shapes divide


def _to_np_column(value: Any) -> np.ndarray:
    """Coerce a non-tensor column to a 1-d+ numpy array (lists of str/dict become dtype=object)."""
    if isinstance(value, np.ndarray):
        return value
    arr = np.empty(len(value), dtype=object)
    arr[:] = list(value)
    return arr


class DataProto:
    """Named tensors + non-tensor columns + meta, all indexed by sample (the first dimension)."""

    __slots__ = ("batch", "non_tensor", "meta", "_borrowed")

    def __init__(
        self,
        batch: Mapping[str, torch.Tensor] | None = None,
        non_tensor: Mapping[str, Any] | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> None:
        self.batch: dict[str, torch.Tensor] = dict(batch or {})
        self.non_tensor: dict[str, np.ndarray] = {k: _to_np_column(v) for k, v in (non_tensor or {}).items()}
        self.meta: dict[str, Any] = dict(meta or {})
        self._borrowed = False
        self._check()

    # ---- construction ------------------------------------------------------------------------
    @classmethod
    def from_dict(
        cls,
        tensors: Mapping[str, Any] | None = None,
        non_tensors: Mapping[str, Any] | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> DataProto:
        """Build from plain dicts; tensor values may be anything ``torch.as_tensor`` takes."""
        batch = {
            k: v if isinstance(v, torch.Tensor) else torch.as_tensor(v) for k, v in (tensors or {}).items()
        }
        return cls(batch, non_tensors, meta)

    def _check(self) -> None:
        lengths = {}
        for k, v in self.batch.items():
            if not isinstance(v, torch.Tensor):
                raise TypeError(f"DataProto.batch[{k!r}] must be a torch.Tensor, got {type(v).__name__}")
            if v.dim() == 0:
                raise ValueError(f"DataProto.batch[{k!r}] is a 0-d tensor; rows need a first dimension")
            lengths[f"batch[{k!r}]"] = v.shape[0]
        for k, v in self.non_tensor.items():
            if v.ndim == 0:
                raise ValueError(f"DataProto.non_tensor[{k!r}] is 0-d; it needs one entry per row")
            lengths[f"non_tensor[{k!r}]"] = v.shape[0]
        if len(set(lengths.values())) > 1:
            raise ValueError(f"DataProto columns disagree on the number of rows: {lengths}")

    # ---- size and indexing -------------------------------------------------------------------
    def __len__(self) -> int:
        for v in self.batch.values():
            return v.shape[0]
        for v in self.non_tensor.values():
            return v.shape[0]
        return 0

    def keys(self) -> list[str]:
        return list(self.batch) + list(self.non_tensor)

    def __contains__(self, key: str) -> bool:
        return key in self.batch or key in self.non_tensor

    def __getitem__(self, item: Any) -> Any:
        """``dp["name"]`` returns a column; an int, slice, index list/tensor or bool mask selects rows."""
        if isinstance(item, str):
            return self.batch[item] if item in self.batch else self.non_tensor[item]
        if isinstance(item, torch.Tensor) and item.dim() == 0 and not item.dtype.is_floating_point:
            item = int(item)
        if isinstance(item, (int, np.integer)) and not isinstance(item, bool):
            item = int(item)
            n = len(self)
            if not -n <= item < n:
                raise IndexError(f"row {item} out of range for a DataProto of {n} rows")
            item = slice(item % n, item % n + 1)
        if isinstance(item, slice):
            return DataProto(
                {k: v[item] for k, v in self.batch.items()},
                {k: v[item] for k, v in self.non_tensor.items()},
                self.meta,
            )
        idx = torch.as_tensor(item)
        if idx.dtype == torch.bool:
            idx = idx.nonzero().flatten()
        idx_np = idx.cpu().numpy()
        return DataProto(
            {k: v[idx.to(v.device)] for k, v in self.batch.items()},
            {k: v[idx_np] for k, v in self.non_tensor.items()},
            self.meta,
        )

    def select(
        self, keys: Iterable[str] | None = None, non_tensor_keys: Iterable[str] | None = None
    ) -> DataProto:
        """A DataProto with only the named columns (``None`` keeps all of that kind)."""
        batch = self.batch if keys is None else {k: self.batch[k] for k in keys}
        nt = self.non_tensor if non_tensor_keys is None else {k: self.non_tensor[k] for k in non_tensor_keys}
        return DataProto(batch, nt, self.meta)

    def pop(self, keys: Iterable[str] = (), non_tensor_keys: Iterable[str] = ()) -> DataProto:
        """Remove the named columns from this DataProto and return them as a new one."""
        batch = {k: self.batch.pop(k) for k in keys}
        nt = {k: self.non_tensor.pop(k) for k in non_tensor_keys}
        return DataProto(batch, nt, self.meta)

    # ---- combining ---------------------------------------------------------------------------
    def union(self, other: DataProto) -> DataProto:
        """All columns of both; a key present in both must hold equal values, else ValueError."""
        if len(self.keys()) and len(other.keys()) and len(self) != len(other):
            raise ValueError(f"union of DataProtos with {len(self)} and {len(other)} rows")
        batch = dict(self.batch)
        for k, v in other.batch.items():
            if k in batch and not (
                batch[k].shape == v.shape
                and batch[k].dtype == v.dtype
                and torch.equal(batch[k], v.to(batch[k].device))
            ):
                raise ValueError(f"union conflict: tensor {k!r} differs between the two DataProtos")
            batch.setdefault(k, v)
        nt = dict(self.non_tensor)
        for k, v in other.non_tensor.items():
            if k in nt and not _np_equal(nt[k], v):
                raise ValueError(
                    f"union conflict: non-tensor column {k!r} differs between the two DataProtos"
                )
            nt.setdefault(k, v)
        meta = dict(self.meta)
        for k, v in other.meta.items():
            if k in meta and not _meta_equal(meta[k], v):
                raise ValueError(
                    f"union conflict: meta {k!r} is {meta[k]!r} on one side and {v!r} on the other"
                )
            meta.setdefault(k, v)
        return DataProto(batch, nt, meta)

    def chunk(self, n: int) -> list[DataProto]:
        """Split into ``n`` equal consecutive parts; the length must be divisible by ``n``."""
        if n < 1:
            raise ValueError(f"chunk(n) needs n >= 1, got {n}")
        size = len(self)
        if size % n:
            raise ValueError(
                f"cannot chunk {size} rows into {n} equal parts; call pad_to_divisor({n}) first "
                f"(it returns the pad size to pass to unpad afterwards)"
            )
        step = size // n
        return [self[i * step : (i + 1) * step] for i in range(n)]

    @staticmethod
    def concat(parts: Sequence[DataProto]) -> DataProto:
        """Rows of ``parts`` in order; all parts must have the same columns. Meta of the first wins."""
        if not parts:
            raise ValueError("DataProto.concat needs at least one part")
        first = parts[0]
        for i, p in enumerate(parts[1:], 1):
            if set(p.batch) != set(first.batch) or set(p.non_tensor) != set(first.non_tensor):
                raise ValueError(
                    f"DataProto.concat: part {i} has columns {sorted(p.keys())}, part 0 has {sorted(first.keys())}"
                )
        if len(parts) == 1 and not first._borrowed:
            return DataProto(dict(first.batch), dict(first.non_tensor), first.meta)
        batch = {k: cat_rows([p.batch[k] for p in parts]) for k in first.batch}
        nt = {k: np.concatenate([p.non_tensor[k] for p in parts]) for k in first.non_tensor}
        return DataProto(batch, nt, first.meta)

    def repeat(self, n: int, interleave: bool = True) -> DataProto:
        """Each row ``n`` times: interleaved keeps copies of row i adjacent (GRPO groups)."""
        if n < 1:
            raise ValueError(f"repeat(n) needs n >= 1, got {n}")
        if interleave:
            batch = {k: v.repeat_interleave(n, dim=0) for k, v in self.batch.items()}
            nt = {k: np.repeat(v, n, axis=0) for k, v in self.non_tensor.items()}
        else:
            batch = {k: v.repeat(n, *([1] * (v.dim() - 1))) for k, v in self.batch.items()}
            nt = {k: np.concatenate([v] * n) for k, v in self.non_tensor.items()}
        return DataProto(batch, nt, self.meta)

    def pad_to_divisor(self, d: int) -> tuple[DataProto, int]:
        """Append rows (copies of rows from the start, cycling) so ``len % d == 0``; return the pad size."""
        if d < 1:
            raise ValueError(f"pad_to_divisor(d) needs d >= 1, got {d}")
        n = len(self)
        pad = (-n) % d
        if pad == 0:
            return self, 0
        if n == 0:
            raise ValueError(f"cannot pad an empty DataProto to a multiple of {d}")
        idx = torch.arange(pad) % n
        return DataProto.concat([self, self[idx]]), pad

    def mark_padding(self, rows: int) -> DataProto:
        """A copy whose ``PADDING`` column also marks the last ``rows`` rows (earlier marks are kept).

        Always adds the column (all False for ``rows == 0``), so the shards of one split agree on
        their columns.
        """
        n = len(self)
        if not 0 <= rows <= n:
            raise ValueError(f"mark_padding({rows}) on a DataProto of {n} rows")
        mask = self.padding_mask().clone()
        mask[n - rows :] = True
        return DataProto({**self.batch, PADDING: mask}, self.non_tensor, self.meta)

    def padding_mask(self) -> torch.Tensor:
        """(rows,) bool: True where a row is padding (the ``PADDING`` column; all False without it)."""
        if PADDING in self.batch:
            return self.batch[PADDING].bool()
        return torch.zeros(len(self), dtype=torch.bool)

    def without_padding_column(self) -> DataProto:
        """The same rows without the ``PADDING`` column (what collect hands back to the driver)."""
        if PADDING not in self.batch:
            return self
        return DataProto({k: v for k, v in self.batch.items() if k != PADDING}, self.non_tensor, self.meta)

    def unpad(self, pad_size: int) -> DataProto:
        """Drop the last ``pad_size`` rows added by ``pad_to_divisor``."""
        if pad_size < 0 or pad_size > len(self):
            raise ValueError(f"unpad({pad_size}) on a DataProto of {len(self)} rows")
        return self if pad_size == 0 else self[: len(self) - pad_size]

    def to(self, device: torch.device | str, non_blocking: bool = False) -> DataProto:
        """Tensors moved to ``device`` (non-tensor columns stay numpy)."""
        return DataProto(
            {k: v.to(device, non_blocking=non_blocking) for k, v in self.batch.items()},
            self.non_tensor,
            self.meta,
        )

    # ---- equality, repr, pickling ------------------------------------------------------------
    def equals(self, other: DataProto) -> bool:
        """Same columns with equal values (tensors: dtype, shape and values) and equal meta."""
        if set(self.batch) != set(other.batch) or set(self.non_tensor) != set(other.non_tensor):
            return False
        for k, v in self.batch.items():
            o = other.batch[k]
            if v.shape != o.shape or v.dtype != o.dtype or not torch.equal(v, o.to(v.device)):
                return False
        if not all(_np_equal(v, other.non_tensor[k]) for k, v in self.non_tensor.items()):
            return False
        return self.meta.keys() == other.meta.keys() and all(
            _meta_equal(self.meta[k], other.meta[k]) for k in self.meta
        )

    def __repr__(self) -> str:
        cols = ", ".join(
            f"{k}:{tuple(v.shape)}:{str(v.dtype).replace('torch.', '')}" for k, v in self.batch.items()
        )
        nts = ", ".join(self.non_tensor)
        return f"DataProto(len={len(self)}, batch=[{cols}], non_tensor=[{nts}], meta={sorted(self.meta)})"

    def __getstate__(self) -> dict:
        return {
            "batch": {k: pack_tensor(v) for k, v in self.batch.items()},
            "non_tensor": self.non_tensor,
            "meta": self.meta,
        }

    def __setstate__(self, state: dict) -> None:
        borrow = _BORROW.get()
        self.batch = {k: unpack_tensor(v, borrow) for k, v in state["batch"].items()}
        self.non_tensor = {k: np.array(v, copy=True) for k, v in state["non_tensor"].items()}
        self.meta = state["meta"]
        self._borrowed = borrow

    @property
    def nbytes(self) -> int:
        """Bytes held by the tensor columns (non-tensor columns are not counted)."""
        return sum(v.numel() * v.element_size() for v in self.batch.values())


def _np_equal(a: np.ndarray, b: np.ndarray) -> bool:
    if a.shape != b.shape:
        return False
    if a.dtype == object or b.dtype == object:
        return all(_meta_equal(x, y) for x, y in zip(a.tolist(), b.tolist(), strict=True))
    return bool(np.array_equal(a, b, equal_nan=a.dtype.kind == "f"))


def _meta_equal(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return _np_equal(np.asarray(a), np.asarray(b))
    try:
        return bool(a == b)
    except Exception:  # objects whose == is ambiguous
        return a is b
