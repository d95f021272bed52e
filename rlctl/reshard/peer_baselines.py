"""The weight syncs peer frameworks ship, modelled on the same ranks, inputs and outputs as the planned
reshard, so ``rlctl bench reshard`` can time them side by side.

Every rank is a colocated trainer + rollout worker: it holds its FSDP dim-0 shard of every HF
parameter and must end with its rollout TP rank's tensors (``out``). What each peer does per rank:

* :func:`verl_bucketed` (verl, FSDP2 + vLLM, colocated): every parameter's full tensor is gathered
  (``DTensor.full_tensor()``, an all-gather over the FSDP ranks, in ``named_parameters`` order),
  packed into one reused bucket buffer; a full bucket is handed to the rollout worker, whose
  ``model.load_weights`` narrows each full tensor to its TP slice. Modelled from
  verl/workers/rollout/vllm_rollout/bucketed_weight_transfer.py (``BucketedWeightSender``: packs
  ``weight.view(-1).view(torch.uint8)`` into a ``bucket_size_mb`` buffer, default 512, sends the
  bucket's metadata over ZMQ, the receiver rebuilds views and calls ``load_weights``) and
  verl/workers/sharding_manager/fsdp_vllm.py (``update_params``: ``param.full_tensor()`` per
  parameter into ``model.load_weights``).
* :func:`openrlhf_broadcast` (OpenRLHF, DeepSpeed ZeRO-3 + vLLM): per parameter,
  ``deepspeed.zero.GatheredParameters([param])`` (an all-gather over the train ranks), then rank 0
  ``torch.distributed.broadcast(param.data, 0, group=model_update_group)`` to every vLLM worker,
  which receives into ``torch.empty(shape)`` and calls ``load_weights([(name, weight)])``. Modelled
  from openrlhf/trainer/ray/ppo_actor.py (``_broadcast_to_vllm``) and
  openrlhf/trainer/ray/vllm_worker_wrap.py (``update_weight``). The vLLM worker of rank 0 loads
  from rank 0's gathered tensor; every other rank's worker receives the broadcast.
* :func:`trl_full_gather` (TRL ``GRPOTrainer``, DeepSpeed ZeRO-3, ``ds3_gather_for_generation``):
  ``with GatheredParameters(list(model.parameters()))`` gathers the whole model on every rank,
  then each ``(name, param.data)`` goes to ``llm_model.load_weights``. Modelled from
  trl/trainer/grpo_trainer.py (``_move_model_to_vllm``).

``load_weights`` is modelled by :class:`RolloutLoader`: the copies vLLM's ``weight_loader`` s make
(narrow the full tensor, copy into the rank's merged parameter). What is not modelled: Python and
RPC overheads of the real engines (ZMQ messages, Ray calls, per-tensor metadata), which only add to
the peers' times.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

import torch

from rlctl.reshard.baselines import gather_full, gather_one
from rlctl.reshard.executor import local_tensor
from rlctl.reshard.layout import Block, Layout

PEER_STRATEGIES = ("verl", "openrlhf", "trl")


class RolloutLoader:
    """This rank's ``load_weights``: full HF tensor -> the slices its rollout tensors hold.

    ``out`` are the rollout engine's tensors (filled in place); padding rows are zeroed once per sync
    (vLLM's vocab-parallel loader zero-fills them on every load).
    """

    def __init__(self, rollout: Layout, rank: int, out: Mapping[str, torch.Tensor]) -> None:
        self.targets: dict[str, list[tuple[torch.Tensor, Block]]] = defaultdict(list)
        for lt in rollout.ranks[rank]:
            t = out[lt.name]
            if lt.padded:
                t.zero_()
            t2 = t.view(lt.shape[0], -1)
            for b in lt.blocks:
                self.targets[b.param].append((t2, b))

    def load(self, name: str, full: torch.Tensor) -> None:
        src = full.reshape(full.shape[0], -1) if full.dim() != 2 else full
        for t2, b in self.targets.get(name, ()):
            t2[b.at : b.at + b.rows].copy_(src[b.row0 : b.row1, b.col0 : b.col1])


def _world(group: object | None) -> int:
    """Ranks of the training group (1 without torch.distributed)."""
    import torch.distributed as dist

    return dist.get_world_size(group) if dist.is_initialized() else 1


def verl_bucketed(
    params: Mapping[str, tuple[int, ...]],
    shards: Mapping[str, torch.Tensor],
    rollout: Layout,
    rank: int,
    train_world: int,
    dtype: torch.dtype,
    out: Mapping[str, torch.Tensor],
    bucket_bytes: int,
    group: object | None = None,
) -> None:
    """verl: full tensor per parameter, packed into a ``bucket_bytes`` buffer, loaded bucket by bucket."""
    loader = RolloutLoader(rollout, rank, out)
    world = _world(group)
    buffer = torch.empty(bucket_bytes, dtype=torch.uint8)  # allocated once and reused, as verl does
    pending: list[tuple[str, tuple[int, ...], int]] = []
    offset, itemsize = 0, torch.empty((), dtype=dtype).element_size()

    def flush() -> None:
        for name, shape, at in pending:
            n = 1
            for d in shape:
                n *= d
            nbytes = n * itemsize
            loader.load(name, buffer[at : at + nbytes].view(dtype).view(shape))
        pending.clear()

    for name, shape in params.items():
        shard = local_tensor(shards[name]) if name in shards else None
        full = gather_one(shard, shape, train_world, world, dtype, group)
        nbytes = full.numel() * full.element_size()
        if nbytes > bucket_bytes:  # verl sends a weight larger than the bucket on its own
            flush()
            offset = 0
            loader.load(name, full)
            continue
        if offset + nbytes > bucket_bytes:
            flush()
            offset = 0
        buffer[offset : offset + nbytes].copy_(full.reshape(-1).view(torch.uint8))
        pending.append((name, shape, offset))
        offset += nbytes
        del full
    flush()


def openrlhf_broadcast(
    params: Mapping[str, tuple[int, ...]],
    shards: Mapping[str, torch.Tensor],
    rollout: Layout,
    rank: int,
    train_world: int,
    dtype: torch.dtype,
    out: Mapping[str, torch.Tensor],
    group: object | None = None,
) -> None:
    """OpenRLHF: per parameter, ZeRO-3 all-gather, then rank 0 broadcasts it to every rollout worker."""
    import torch.distributed as dist

    loader = RolloutLoader(rollout, rank, out)
    world = _world(group)
    root = 0 if group is None else dist.get_global_rank(group, 0)
    for name, shape in params.items():
        shard = local_tensor(shards[name]) if name in shards else None
        full = gather_one(shard, shape, train_world, world, dtype, group)
        if not dist.is_initialized():
            loader.load(name, full)
        elif rank == 0:
            dist.broadcast(full.contiguous(), root, group=group)
            loader.load(name, full)
        else:
            weight = torch.empty(shape, dtype=dtype)  # vllm_worker_wrap.update_weight's receive buffer
            dist.broadcast(weight, root, group=group)
            loader.load(name, weight)
        del full


def trl_full_gather(
    params: Mapping[str, tuple[int, ...]],
    shards: Mapping[str, torch.Tensor],
    rollout: Layout,
    rank: int,
    train_world: int,
    dtype: torch.dtype,
    out: Mapping[str, torch.Tensor],
    group: object | None = None,
) -> None:
    """TRL: gather the whole model on every rank, then load every parameter."""
    loader = RolloutLoader(rollout, rank, out)
    full = gather_full(params, shards, train_world, rollout.world, dtype, group)
    for name, t in full.items():
        loader.load(name, t)
    del full


def recv_bytes_per_rank(strategy: str, model_bytes: int, p: int, world: int) -> int:
    """Bytes the busiest rank receives (the transport's share of a strategy's time)."""
    gathered = model_bytes * (p - 1) // p if world > 1 else 0
    if strategy == "openrlhf":
        return gathered + (model_bytes if world > 1 else 0)
    return gathered
