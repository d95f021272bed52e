"""The calls engines make: train shards -> rollout tensors (and back), bucket by bucket."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from functools import lru_cache
from typing import Any

import torch

from rlctl.errors import UserError
from rlctl.reshard.executor import RankExecutor, run_rank, run_rank_p2p, torch_all_to_all
from rlctl.reshard.layout import Layout, fsdp_layout, rollout_layout
from rlctl.reshard.model import ModelSpec, spec_from_config
from rlctl.reshard.plan import Plan, make_plan

DEFAULT_BUCKET_BYTES = 256 * 1024 * 1024


def _spec(config: Any, dtype: torch.dtype) -> ModelSpec:
    if isinstance(config, ModelSpec):
        return config if config.dtype == dtype else dataclasses.replace(config, dtype=dtype)
    return spec_from_config(config, dtype)


def world_for(train_world: int, rollout_tp: int) -> int:
    """Ranks taking part: ``max(p, q)``; ranks ``>= p`` hold no train shard (only when ``q > p``)."""
    if train_world < 1 or rollout_tp < 1:
        raise UserError(f"reshard: train world {train_world} and rollout tp {rollout_tp} must be >= 1")
    world = max(train_world, rollout_tp)
    if world % rollout_tp:
        raise UserError(f"reshard: train world {train_world} is not a multiple of rollout tp {rollout_tp}")
    return world


@lru_cache(maxsize=32)
def _cached_plan(
    spec: ModelSpec, p: int, q: int, rank_order: str, fmt: str, bucket_bytes: int, reverse: bool
) -> Plan:
    world = world_for(p, q)
    train: Layout = fsdp_layout(spec, p, world)
    rollout = rollout_layout(spec, q, world, rank_order=rank_order, fmt=fmt)
    itemsize = torch.empty((), dtype=spec.dtype).element_size()
    return (
        make_plan(rollout, train, itemsize, bucket_bytes)
        if reverse
        else make_plan(train, rollout, itemsize, bucket_bytes)
    )


def train_to_rollout_plan(
    config: Any,
    train_world: int,
    rollout_tp: int,
    *,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    rank_order: str = "contiguous",
    fmt: str = "vllm",
    dtype: torch.dtype = torch.bfloat16,
    reverse: bool = False,
) -> Plan:
    """The (cached) plan from FSDP2 shards over ``train_world`` ranks to rollout TP ``rollout_tp``
    (``reverse=True``: rollout -> train)."""
    return _cached_plan(_spec(config, dtype), train_world, rollout_tp, rank_order, fmt, bucket_bytes, reverse)


def reshard_train_to_rollout(
    config: Any,
    *,
    train_world: int,
    rank: int,
    rollout_tp: int,
    local_shards: Mapping[str, torch.Tensor],
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    group: object | None = None,
    rank_order: str = "contiguous",
    fmt: str = "vllm",
    out: Mapping[str, torch.Tensor] | None = None,
    stats: dict[str, int] | None = None,
    dtype: torch.dtype | None = None,
    transport: str = "auto",
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Yield this rank's rollout tensors bucket by bucket; every rank of ``group`` must iterate it.

    ``local_shards``: HF name -> this rank's FSDP2 shard (plain tensor or DTensor). ``out``: optional
    rollout name -> existing tensor to fill in place (e.g. the rollout engine's own parameters).
    ``stats`` (optional dict) receives ``peak_extra_bytes`` and ``peak_buffer_bytes`` at the end.
    ``dtype`` defaults to the shards' dtype (give it on ranks that hold no shard, when q > p).
    ``transport``: ``"all_to_all"`` (one packed ``all_to_all_single`` per bucket), ``"p2p"``
    (``batch_isend_irecv`` per piece, contiguous pieces sent and received in place, no packing) or
    ``"auto"``: p2p on gloo (measured 2x faster there: no pack/unpack copies), all_to_all otherwise.
    """
    executor = _executor(
        config, train_world, rank, rollout_tp, local_shards, bucket_bytes, rank_order, fmt, dtype, False, out
    )
    yield from _run(executor, group, transport)
    if stats is not None:
        stats["peak_extra_bytes"] = executor.meter.peak_total
        stats["peak_buffer_bytes"] = executor.meter.peak_buffers


def reshard_rollout_to_train(
    config: Any,
    *,
    train_world: int,
    rank: int,
    rollout_tp: int,
    local_rollout: Mapping[str, torch.Tensor],
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    group: object | None = None,
    rank_order: str = "contiguous",
    fmt: str = "vllm",
    dtype: torch.dtype | None = None,
    transport: str = "auto",
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """The inverse move: rollout tensors -> FSDP2 dim-0 shards (HF names), bucket by bucket."""
    executor = _executor(
        config, train_world, rank, rollout_tp, local_rollout, bucket_bytes, rank_order, fmt, dtype, True, None
    )
    yield from _run(executor, group, transport)


def _executor(
    config: Any,
    train_world: int,
    rank: int,
    rollout_tp: int,
    local: Mapping[str, torch.Tensor],
    bucket_bytes: int,
    rank_order: str,
    fmt: str,
    dtype: torch.dtype | None,
    reverse: bool,
    out: Mapping[str, torch.Tensor] | None,
) -> RankExecutor:
    """This rank's executor of the (cached) plan in either direction; dtype defaults to the inputs'."""
    dtype = dtype or (next(iter(local.values())).dtype if local else torch.bfloat16)
    plan = train_to_rollout_plan(
        config,
        train_world,
        rollout_tp,
        bucket_bytes=bucket_bytes,
        rank_order=rank_order,
        fmt=fmt,
        dtype=dtype,
        reverse=reverse,
    )
    if not 0 <= rank < plan.world:
        raise UserError(f"reshard: rank {rank} outside world {plan.world}")
    return RankExecutor(plan, rank, local, dtype=dtype, out=out)


def _run(
    executor: RankExecutor, group: object | None, transport: str
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    if transport not in ("all_to_all", "p2p", "auto"):
        raise UserError(f"reshard: transport {transport!r}; expected 'all_to_all', 'p2p' or 'auto'")
    if transport == "auto" and executor.plan.world > 1:
        import torch.distributed as dist

        transport = "p2p" if dist.get_backend(group) == "gloo" else "all_to_all"
    if executor.plan.world == 1:
        yield from run_rank(executor, None)
    elif transport == "p2p":
        yield from run_rank_p2p(executor, group)
    else:
        yield from run_rank(executor, torch_all_to_all(group))


def choose_rank_order(
    config: Any, train_world: int, rollout_tp: int, ranks_per_node: int, *, fmt: str = "hf_tp"
) -> tuple[str, str]:
    """How to group ``train_world`` FSDP ranks into rollout TP groups of ``rollout_tp``, and why.

    ``strided`` (HybridFlow's grouping: TP rank ``r // (world / tp)``) keeps more of each rank's
    FSDP rows on the rank that needs them, so fewer bytes cross ranks; it is taken when it moves
    fewer bytes and its TP groups, which span the whole world, stay inside one node (a TP group
    talks at every layer of every decode step: it needs the node's fast links). Otherwise the
    ``contiguous`` groups vLLM and verl launch (ranks ``[d*tp, (d+1)*tp)``, inside a node).
    """
    if rollout_tp == 1:
        return "contiguous", "rollout tensor-parallel 1: one engine copy per rank"
    if train_world == rollout_tp:
        return "contiguous", f"one rollout replica of all {train_world} ranks (both orders are the same)"
    if train_world > ranks_per_node:
        return "contiguous", (
            f"strided TP groups would span nodes ({train_world} ranks, {ranks_per_node} a node): "
            "contiguous groups keep each replica inside a node"
        )
    moved = {
        order: train_to_rollout_plan(config, train_world, rollout_tp, rank_order=order, fmt=fmt).bytes_moved()
        for order in ("contiguous", "strided")
    }
    pick = "strided" if moved["strided"] < moved["contiguous"] else "contiguous"
    gib = {k: v / 2**30 for k, v in moved.items()}
    return pick, (
        f"{pick}: {gib[pick]:.3g} GiB cross ranks per sync in bf16 "
        f"(contiguous {gib['contiguous']:.3g}, strided {gib['strided']:.3g})"
    )
