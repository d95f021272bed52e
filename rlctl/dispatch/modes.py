"""``@register`` and the dispatch-mode registry: how one driver call becomes one call per rank.

A mode is a pair of pure functions over the group's ``Mesh``:

- ``dispatch_fn(mesh, args, kwargs) -> list[(args, kwargs)]``, one entry per rank;
- ``collect_fn(mesh, outputs: dict[rank, output]) -> result``, given the outputs of the ranks in
  ``collect_ranks(mesh)`` (all executed ranks by default).

Padding never reaches collect: DP splits travel as ``Shard``s that know their padding rows and each
rank drops the outputs of those rows (``futures.execute_on_rank``). Padding rows are also marked in
the shards' ``PADDING`` column (see ``proto``), so methods whose effect is not a per-row output
(an optimiser step, metrics) can leave them out; collect drops the column again. Custom modes are
added with ``register_dispatch_mode`` and may reuse ``split_for_dp`` and ``mark_shards``.
"""

from __future__ import annotations

import enum
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rlctl.dispatch.futures import DispatchFuture, Shard, split_for_dp
from rlctl.dispatch.mesh import Mesh
from rlctl.dispatch.proto import PADDING, DataProto


class Dispatch(str, enum.Enum):
    """Built-in dispatch modes (values are their registry names)."""

    ONE_TO_ALL = "ONE_TO_ALL"  # every rank gets the same arguments; collect a list of all outputs
    ALL_TO_ALL = "ALL_TO_ALL"  # each argument is a list, one item per rank; collect a list
    DP_COMPUTE_PROTO = "DP_COMPUTE_PROTO"  # pad + split over DP, replicate over tp/pp; concat, unpad
    # split like DP_COMPUTE_PROTO (padding rows are copies of real rows, marked in the PADDING
    # column: the method must leave them out); a list of one output per DP group
    DP_COMPUTE_METRICS = "DP_COMPUTE_METRICS"
    RANK_ZERO = "RANK_ZERO"  # only rank 0 runs, with the arguments as given; its output
    # DP_COMPUTE_PROTO over the group's rollout mesh (Mesh.rollout): split over the rollout
    # replicas, replicated over the TP ranks of each, one answer per replica
    ROLLOUT_COMPUTE_PROTO = "ROLLOUT_COMPUTE_PROTO"


class Execute(str, enum.Enum):
    ALL = "ALL"
    RANK_ZERO = "RANK_ZERO"


DispatchFn = Callable[[Mesh, tuple, dict], list[tuple[tuple, dict]]]
CollectFn = Callable[[Mesh, dict[int, Any]], Any]


@dataclass(frozen=True)
class DispatchMode:
    name: str
    dispatch_fn: DispatchFn
    collect_fn: CollectFn
    collect_ranks: Callable[[Mesh], list[int]] | None = None
    default_execute: Execute = Execute.ALL


@dataclass(frozen=True)
class MethodSpec:
    """What ``@register`` records on a worker method."""

    mode: str
    execute: Execute | None
    blocking: bool


_MODES: dict[str, DispatchMode] = {}
SPEC_ATTR = "__rlctl_dispatch__"


def register_dispatch_mode(
    name: str,
    dispatch_fn: DispatchFn,
    collect_fn: CollectFn,
    collect_ranks: Callable[[Mesh], list[int]] | None = None,
    default_execute: Execute = Execute.ALL,
    replace: bool = False,
) -> DispatchMode:
    """Add a dispatch mode usable as ``@register(dispatch_mode="name")``."""
    if name in _MODES and not replace:
        raise ValueError(f"dispatch mode {name!r} is already registered (pass replace=True to override)")
    mode = DispatchMode(name, dispatch_fn, collect_fn, collect_ranks, default_execute)
    _MODES[name] = mode
    return mode


def get_mode(name: str | Dispatch) -> DispatchMode:
    key = name.value if isinstance(name, Dispatch) else str(name)
    if key not in _MODES:
        raise KeyError(f"unknown dispatch mode {key!r}; registered: {sorted(_MODES)}")
    return _MODES[key]


def register(
    dispatch_mode: Dispatch | str = Dispatch.ALL_TO_ALL,
    execute_mode: Execute | None = None,
    blocking: bool = True,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Mark a Worker method as callable from the driver through its WorkerGroup.

    ``timeout`` and ``blocking`` are the driver's per-call options (``wg.method(batch, timeout=30)``),
    so a registered method may not take parameters with those names.
    """
    mode = get_mode(dispatch_mode)  # fail at import time for unknown modes

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        reserved = {"timeout", "blocking"} & set(inspect.signature(fn).parameters)
        if reserved:
            raise TypeError(
                f"@register method {fn.__qualname__} may not take {sorted(reserved)}: "
                "those keywords are the driver's call options"
            )
        setattr(fn, SPEC_ATTR, MethodSpec(mode.name, execute_mode, blocking))
        return fn

    return deco


def registered_methods(cls: type) -> dict[str, MethodSpec]:
    """``{name: spec}`` of the ``@register`` methods of a worker class (inherited ones included)."""
    out = {}
    for name in dir(cls):
        spec = getattr(getattr(cls, name, None), SPEC_ATTR, None)
        if isinstance(spec, MethodSpec):
            out[name] = spec
    return out


# ---- built-in modes ----------------------------------------------------------------------------


def _whole(v: Any) -> Any:
    return v.lazy() if isinstance(v, DispatchFuture) else v


def dispatch_one_to_all(mesh: Mesh, args: tuple, kwargs: dict) -> list[tuple[tuple, dict]]:
    a = tuple(_whole(v) for v in args)
    k = {key: _whole(v) for key, v in kwargs.items()}
    return [(a, k)] * mesh.world_size


def dispatch_all_to_all(mesh: Mesh, args: tuple, kwargs: dict) -> list[tuple[tuple, dict]]:
    n = mesh.world_size

    def item(v: Any, r: int, where: str) -> Any:
        if isinstance(v, DispatchFuture):
            return v.lazy(("item", r))
        if not isinstance(v, (list, tuple)) or len(v) != n:
            raise ValueError(
                f"ALL_TO_ALL argument {where} must be a list of {n} items (one per rank), got {v!r:.80}"
            )
        return v[r]

    return [
        (
            tuple(item(v, r, f"#{i}") for i, v in enumerate(args)),
            {key: item(v, r, key) for key, v in kwargs.items()},
        )
        for r in range(n)
    ]


def mark_shards(shards: list[Shard]) -> list[Shard]:
    """Mark each shard's padding rows in its ``PADDING`` column, on every shard once any pads."""
    if not any(s.pad_rows for s in shards) and not any(PADDING in s.data.batch for s in shards):
        return shards
    return [Shard(s.data.mark_padding(s.pad_rows), s.pad_rows) for s in shards]


def dispatch_dp(mesh: Mesh, args: tuple, kwargs: dict) -> list[tuple[tuple, dict]]:
    """Pad and split DataProto (or future) arguments over DP; replicate over the other axes."""
    dp = mesh.dp_size
    lengths = {len(v) for v in [*args, *kwargs.values()] if isinstance(v, DataProto)}
    if len(lengths) > 1:
        raise ValueError(
            f"DataProto arguments of one DP call must have the same length, got {sorted(lengths)}"
        )

    def split(v: Any) -> list[Any]:
        if isinstance(v, DataProto):
            return mark_shards(split_for_dp(v, dp))
        if isinstance(v, DispatchFuture):
            return [v.lazy(("chunk", dp, d)) for d in range(dp)]
        return [v] * dp  # anything else (a step number, a config) is broadcast

    split_args = [split(v) for v in args]
    split_kwargs = {key: split(v) for key, v in kwargs.items()}
    per_dp = [
        (tuple(s[d] for s in split_args), {key: s[d] for key, s in split_kwargs.items()}) for d in range(dp)
    ]
    return [per_dp[mesh.dp_rank(r)] for r in range(mesh.world_size)]


def collect_all(mesh: Mesh, outputs: dict[int, Any]) -> list[Any]:
    return [outputs[r] for r in sorted(outputs)]


def _unmarked(out: Any) -> Any:
    return out.without_padding_column() if isinstance(out, DataProto) else out


def collect_dp_proto(mesh: Mesh, outputs: dict[int, Any]) -> Any:
    reps = [outputs[r] for r in mesh.representatives()]
    if all(isinstance(o, DataProto) for o in reps):
        return DataProto.concat([_unmarked(o) for o in reps])
    if all(o is None for o in reps):
        return None
    kinds = sorted({type(o).__name__ for o in reps})
    raise TypeError(f"DP_COMPUTE_PROTO methods must return DataProto (or None) on every rank, got {kinds}")


collect_dp_proto.copies_parts = True  # concat allocates: the driver may unpickle parts without copying
collect_dp_proto.concat_of = Mesh.representatives  # consumers of a future may fetch just their rows


def collect_dp_metrics(mesh: Mesh, outputs: dict[int, Any]) -> list[Any]:
    return [_unmarked(outputs[r]) for r in mesh.representatives()]


def collect_rank_zero(mesh: Mesh, outputs: dict[int, Any]) -> Any:
    return outputs[0]


register_dispatch_mode(Dispatch.ONE_TO_ALL.value, dispatch_one_to_all, collect_all)
register_dispatch_mode(Dispatch.ALL_TO_ALL.value, dispatch_all_to_all, collect_all)
register_dispatch_mode(
    Dispatch.DP_COMPUTE_PROTO.value, dispatch_dp, collect_dp_proto, collect_ranks=Mesh.representatives
)
register_dispatch_mode(
    Dispatch.DP_COMPUTE_METRICS.value, dispatch_dp, collect_dp_metrics, collect_ranks=Mesh.representatives
)
register_dispatch_mode(
    Dispatch.RANK_ZERO.value,
    dispatch_one_to_all,
    collect_rank_zero,
    collect_ranks=lambda mesh: [0],
    default_execute=Execute.RANK_ZERO,
)


def dispatch_rollout(mesh: Mesh, args: tuple, kwargs: dict) -> list[tuple[tuple, dict]]:
    return dispatch_dp(mesh.rollout(), args, kwargs)


def collect_rollout_proto(mesh: Mesh, outputs: dict[int, Any]) -> Any:
    return collect_dp_proto(mesh.rollout(), outputs)


def _rollout_representatives(mesh: Mesh) -> list[int]:
    return mesh.rollout().representatives()


collect_rollout_proto.copies_parts = True
collect_rollout_proto.concat_of = _rollout_representatives

register_dispatch_mode(
    Dispatch.ROLLOUT_COMPUTE_PROTO.value,
    dispatch_rollout,
    collect_rollout_proto,
    collect_ranks=_rollout_representatives,
)


def plan_call(
    mode: DispatchMode, execute: Execute, mesh: Mesh, args: tuple, kwargs: dict
) -> tuple[dict[int, tuple[tuple, dict]], list[int]]:
    """Per-rank payloads for the ranks that run, and the ranks whose outputs collect reads."""
    per_rank = mode.dispatch_fn(mesh, args, kwargs)
    if len(per_rank) != mesh.world_size:
        raise ValueError(
            f"dispatch mode {mode.name} made {len(per_rank)} payloads for {mesh.world_size} ranks"
        )
    run = [0] if execute == Execute.RANK_ZERO else list(range(mesh.world_size))
    wanted = mode.collect_ranks(mesh) if mode.collect_ranks else run
    missing = [r for r in wanted if r not in run]
    if missing:
        raise ValueError(
            f"dispatch mode {mode.name} collects ranks {missing} that do not run under {execute.value}"
        )
    return {r: per_rank[r] for r in run}, list(wanted)
