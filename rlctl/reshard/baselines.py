"""Baselines the planned reshard is measured against (``rlctl bench reshard``).

* :func:`naive_reshard`: all-gather every parameter to full size on every rank (the whole model is
  materialised on each rank), then cut the rollout tensors out of it.
* :func:`disk_reshard`: gather the full model to rank 0, write it as one safetensors file (fsync'd,
  like a checkpoint that a separate engine loads), every rank loads the file and cuts its tensors.

Both produce exactly the planned reshard's output (the bench checks this) from the same inputs.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import torch

from rlctl.reshard.executor import local_tensor
from rlctl.reshard.layout import Layout, LocalTensor, fsdp_shard_rows


def cut(full: Mapping[str, torch.Tensor], lt: LocalTensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Build one layout tensor from full HF tensors (zero rows where the layout pads)."""
    dtype = next(iter(full.values())).dtype
    t = out if out is not None else torch.empty(lt.shape, dtype=dtype)
    if lt.padded:
        t.zero_()
    t2 = t.view(lt.shape[0], -1)
    for b in lt.blocks:
        src = full[b.param]
        src2 = src.view(src.shape[0], -1)
        t2[b.at : b.at + b.rows].copy_(src2[b.row0 : b.row1, b.col0 : b.col1])
    return t


def _padded_shard(
    shard: torch.Tensor | None, n: int, rest: tuple[int, ...], p: int, dtype: torch.dtype
) -> torch.Tensor:
    size = -(-n // p)
    buf = torch.zeros((size, *rest), dtype=dtype)
    if shard is not None and shard.shape[0]:
        buf[: shard.shape[0]].copy_(shard)
    return buf


def gather_one(
    shard: torch.Tensor | None,
    shape: tuple[int, ...],
    train_world: int,
    world: int,
    dtype: torch.dtype,
    group: object | None = None,
    dst: int | None = None,
) -> torch.Tensor | None:
    """``DTensor.full_tensor()`` of one FSDP2 dim-0 shard (pad to ``ceil(n/p)`` rows, gather, narrow):
    on every rank (``dst=None``, all-gather) or only on ``dst`` (None on the others)."""
    import torch.distributed as dist

    if world == 1:  # one rank: the shard is the full tensor
        return shard
    mine = _padded_shard(shard, shape[0], shape[1:], train_world, dtype)
    rank = dist.get_rank(group)
    gathered = torch.empty((mine.shape[0] * world, *shape[1:]), dtype=dtype) if dst in (None, rank) else None
    if dst is None:
        (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(gathered, mine, group=group)
    else:
        dist.gather(mine, list(gathered.chunk(world)) if gathered is not None else None, dst=dst, group=group)
    return None if gathered is None else gathered[: shape[0]]


def gather_full(
    params: Mapping[str, tuple[int, ...]],
    shards: Mapping[str, torch.Tensor],
    train_world: int,
    world: int,
    dtype: torch.dtype,
    group: object | None = None,
    dst: int | None = None,
) -> dict[str, torch.Tensor]:
    """Full HF tensors from FSDP dim-0 shards: on every rank (``dst=None``, all-gather) or on ``dst``."""
    full: dict[str, torch.Tensor] = {}
    for name, shape in params.items():
        shard = local_tensor(shards[name]) if name in shards else None
        tensor = gather_one(shard, shape, train_world, world, dtype, group, dst)
        if tensor is not None:
            full[name] = tensor
    return full


def naive_reshard(
    params: Mapping[str, tuple[int, ...]],
    shards: Mapping[str, torch.Tensor],
    rollout: Layout,
    rank: int,
    train_world: int,
    dtype: torch.dtype,
    group: object | None = None,
    out: Mapping[str, torch.Tensor] | None = None,
) -> dict[str, torch.Tensor]:
    """All-gather the full model on every rank, then slice this rank's rollout tensors."""
    full = gather_full(params, shards, train_world, rollout.world, dtype, group)
    out = out or {}
    return {lt.name: cut(full, lt, out.get(lt.name)) for lt in rollout.ranks[rank]}


def disk_reshard(
    params: Mapping[str, tuple[int, ...]],
    shards: Mapping[str, torch.Tensor],
    rollout: Layout,
    rank: int,
    train_world: int,
    dtype: torch.dtype,
    path: str,
    group: object | None = None,
    out: Mapping[str, torch.Tensor] | None = None,
) -> dict[str, torch.Tensor]:
    """Gather to rank 0, save one safetensors file (fsync), every rank loads it and slices."""
    from safetensors.torch import load_file, save_file

    world = rollout.world
    full = gather_full(params, shards, train_world, world, dtype, group, dst=0)
    if rank == 0:
        save_file({k: v.contiguous() for k, v in full.items()}, path)
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    del full
    if world > 1:
        import torch.distributed as dist

        dist.barrier(group=group)
    loaded = load_file(path)
    out = out or {}
    return {lt.name: cut(loaded, lt, out.get(lt.name)) for lt in rollout.ranks[rank]}


def fsdp_shard(full: torch.Tensor, train_world: int, rank: int) -> torch.Tensor:
    """This rank's FSDP2 dim-0 shard of a full tensor (a view)."""
    a, b = fsdp_shard_rows(full.shape[0], train_world, rank)
    return full[a:b]
