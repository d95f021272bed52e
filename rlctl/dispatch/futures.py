"""Futures of non-blocking group calls, and the argument wrappers that carry data to a rank.

A non-blocking call returns a ``DispatchFuture``: the per-rank result handles (Ray ObjectRefs, or
finished results in-process) plus how to collect them. Passing it to the next call does not pull
data to the driver: the dispatch turns it into a ``LazyInput`` that each rank resolves itself
(fetching the producer ranks' outputs directly from the object store), then collects, pads and
chunks exactly as the driver would have.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rlctl.dispatch.mesh import Mesh
from rlctl.dispatch.proto import DataProto, borrowing


@dataclass
class CallInfo:
    """Who a call is addressed to: for error messages."""

    role: str
    method: str


class DispatchFuture:
    """Result of a non-blocking call; ``get()`` waits, checks every rank and collects."""

    def __init__(
        self,
        info: CallInfo,
        parts: dict[int, Any],
        collect_fn: Callable[[Mesh, dict[int, Any]], Any],
        collect_ranks: list[int],
        mesh: Mesh,
        backend: Any,
        timeout: float | None = None,
        sizes: dict[int, Any] | None = None,
    ) -> None:
        self.info, self.parts, self.collect_fn, self.sizes = info, parts, collect_fn, sizes
        self.collect_ranks, self.mesh, self._backend, self.timeout = collect_ranks, mesh, backend, timeout
        self._value: Any = None
        self._done = False

    def get(self, timeout: float | None = None) -> Any:
        """Wait for all ranks (raising WorkerError for the first failure), then collect."""
        if not self._done:
            # collect functions that copy their parts anyway (concat) may read them in place
            borrow = (
                borrowing() if getattr(self.collect_fn, "copies_parts", False) else contextlib.nullcontext()
            )
            with borrow:
                values = self._backend.gather(
                    self.info, self.parts, self.collect_ranks, timeout or self.timeout
                )
                self._value = self.collect_fn(self.mesh, values)
            self._done = True
        return self._value

    def done(self) -> bool:
        """True when every rank has finished (successfully or not)."""
        return self._done or self._backend.ready(self.parts)

    def lazy(self, select: tuple | None = None) -> LazyInput:
        """A rank-side stand-in for this future's value (optionally one chunk or item of it)."""
        needed = {r: self.parts[r] for r in self.collect_ranks}
        sizes = None if self.sizes is None else {r: self.sizes[r] for r in self.collect_ranks}
        return LazyInput(self.info, needed, self.collect_fn, self.mesh, select, sizes)

    def __repr__(self) -> str:
        return f"DispatchFuture({self.info.role}.{self.info.method}, ranks={len(self.parts)})"


@dataclass
class Shard:
    """One rank's slice of a DataProto, with how many of its trailing rows are padding."""

    data: DataProto
    pad_rows: int = 0


@dataclass
class LazyInput:
    """A producer call's collected output, resolved on the consuming rank.

    ``select``: None (the whole value), ``("chunk", n, i)`` (pad to a multiple of n, take chunk i,
    the DP_COMPUTE_PROTO split) or ``("item", i)`` (element i of a list, for ALL_TO_ALL).
    ``sizes``: handles to each producer rank's output row count; with them a rank taking one DP
    chunk of a concatenated output fetches only the producer outputs that overlap its rows.
    """

    info: CallInfo
    parts: dict[int, Any]
    collect_fn: Callable[[Mesh, dict[int, Any]], Any]
    mesh: Mesh
    select: tuple | None = field(default=None)
    sizes: dict[int, Any] | None = field(default=None)


def split_for_dp(value: DataProto, n: int) -> list[Shard]:
    """Pad ``value`` to a multiple of ``n`` and split it into ``n`` shards that know their padding."""
    total = len(value)
    padded, pad = value.pad_to_divisor(n)
    chunks = padded.chunk(n)
    size = len(padded) // n
    shards = []
    for i, c in enumerate(chunks):
        lo, hi = i * size, (i + 1) * size
        shards.append(Shard(c, max(0, hi - max(lo, total))))
    return shards


def resolve_arg(arg: Any, fetch: Callable[[dict[int, Any]], dict[int, Any]]) -> tuple[Any, int]:
    """Rank side: turn a Shard / LazyInput into (value, pad_rows); other values pass through."""
    if isinstance(arg, Shard):
        return arg.data, arg.pad_rows
    if not isinstance(arg, LazyInput):
        return arg, 0
    if arg.select is not None and arg.select[0] == "chunk" and arg.sizes is not None:
        shard = _partial_chunk(arg, fetch)
        if shard is not None:
            return shard.data, shard.pad_rows
    value = arg.collect_fn(arg.mesh, fetch(arg.parts))
    if arg.select is None:
        return value, 0
    if arg.select[0] == "chunk":
        _, n, i = arg.select
        if not isinstance(value, DataProto):
            raise TypeError(
                f"a DP split needs a DataProto input, {arg.info.role}.{arg.info.method} gave {type(value)}"
            )
        shard = split_for_dp(value, n)[i]
        return shard.data, shard.pad_rows
    if arg.select[0] == "item":
        return value[arg.select[1]], 0
    raise ValueError(f"unknown lazy selection {arg.select!r}")


def _partial_chunk(arg: LazyInput, fetch: Callable[[dict[int, Any]], dict[int, Any]]) -> Shard | None:
    """Chunk i of n of a concat-collected output, fetching only the producer outputs it needs.

    Gives exactly ``split_for_dp(collected, n)[i]``; None when the sizes do not allow it (then
    the caller collects everything).
    """
    order = getattr(arg.collect_fn, "concat_of", None)
    if order is None:
        return None
    reps = order(arg.mesh)
    lens = fetch(arg.sizes)
    if any(not isinstance(lens[r], int) for r in reps):
        return None
    total = sum(lens[r] for r in reps)
    _, n, i = arg.select
    if total == 0:
        return None
    size = (total + (-total) % n) // n
    lo, hi = i * size, (i + 1) * size
    rows = list(range(lo, min(hi, total))) + [(j - total) % total for j in range(max(lo, total), hi)]
    starts, off = {}, 0
    for r in reps:
        starts[r], off = off, off + lens[r]
    need = [r for r in reps if any(starts[r] <= j < starts[r] + lens[r] for j in rows)]
    got = fetch({r: arg.parts[r] for r in need})
    local, off = {}, 0
    for r in need:
        local[r], off = off, off + lens[r]
    part = DataProto.concat([got[r] for r in need])
    owner = [next(r for r in need if starts[r] <= j < starts[r] + lens[r]) for j in rows]
    idx = [local[r] + j - starts[r] for j, r in zip(rows, owner, strict=True)]
    import torch

    return Shard(part[torch.tensor(idx, dtype=torch.long)], max(0, hi - max(lo, total)))


def trim_output(out: Any, in_rows: int, pad_rows: int) -> Any:
    """Drop the outputs of padding rows: the last ``pad_rows * (len(out) // in_rows)`` rows.

    Outputs may have k rows per input row (e.g. k samples per prompt); padding rows are the last
    ones of the last shards, so their k outputs each are the trailing rows.
    """
    if pad_rows == 0 or not isinstance(out, DataProto):
        return out
    n = len(out)
    if in_rows == 0 or n % in_rows:
        raise ValueError(
            f"output has {n} rows for an input of {in_rows} rows ({pad_rows} of them padding); "
            "a DP_COMPUTE_PROTO method must return a whole multiple of its input rows so padding can be removed"
        )
    return out[: n - pad_rows * (n // in_rows)]


def execute_on_rank(
    fn: Callable[..., Any], args: tuple, kwargs: dict, fetch: Callable[[dict[int, Any]], dict[int, Any]]
) -> Any:
    """What every rank does with its payload: resolve inputs, call, drop padding outputs."""
    pads: set[int] = set()
    rows: set[int] = set()

    def res(a: Any) -> Any:
        value, pad = resolve_arg(a, fetch)
        if isinstance(a, (Shard, LazyInput)) and isinstance(value, DataProto):
            pads.add(pad)
            rows.add(len(value))
            if isinstance(a, LazyInput):  # resolved here, so padded here: mark it as dispatch does
                value = value.mark_padding(pad)
        return value

    real_args = tuple(res(a) for a in args)
    real_kwargs = {k: res(v) for k, v in kwargs.items()}
    if len(pads) > 1 or len(rows) > 1:
        raise ValueError(f"DataProto arguments were split into shards of different sizes {sorted(rows)}")
    out = fn(*real_args, **real_kwargs)
    out = trim_output(out, rows.pop(), pads.pop()) if pads else out
    return out.without_padding_column() if isinstance(out, DataProto) else out
