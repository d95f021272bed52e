"""SGLang at rollout tensor parallelism ``q > 1``, colocated: one ``sglang.Engine(tp_size=q)`` per
replica, on the replica's first rank; every rank of the replica feeds it the weights.

Written against SGLang 0.5.3 and 0.5.23 (paths inside the wheels); not yet run on NVIDIA hardware,
tested against fakes whose TP ranks hold and load shards as the real loaders do.

- ``Engine(tp_size=q, base_gpu_id, gpu_id_step)`` starts one scheduler per TP rank on device
  ``base_gpu_id + i * gpu_id_step`` of those its process sees (``entrypoints/engine.py``); the first
  rank passes the values that put scheduler ``i`` on the device of the replica's rank ``i``
  (:func:`replica_gpu_ids`; devices not so spaced are refused). Under Ray each rank sees its node's
  devices because the pool asks Ray not to narrow them (``node_devices_at_tp``). Its parameters live
  in those processes, out of reach of a planned in-place write. So the replica's first rank holds the engine and the
  other ``q - 1`` ranks only feed it (as verl's SGLang rollout and SGLang's own
  ``srt/weight_sync/utils.py`` ``update_weights`` do).
- Weights (``Engine.update_weights_from_tensor``): each TP rank's model runner unwraps a
  ``LocalSerializedTensor`` to ``values[tp_rank]`` (0.5.3 ``model_executor/model_runner.py``
  ``_unwrap_tensor``; 0.5.23 ``model_runner_components/weight_updater.py``), then its loaders narrow
  the full tensor to that rank's rows (``layers/linear.py``, the vLLM arithmetic). Every rank of the
  replica serialises its own full tensor (``MultiprocessingSerializer``: a CUDA IPC handle on a GPU,
  not the data), the first rank gathers them (``gather_object``) and hands one value per TP rank to
  the engine, so each scheduler maps the tensor of the trainer rank on its own device. The feed is
  therefore full tensors per bucket on every rank (the sync plans layout ``hf``).
- Generation and the canary's scoring run on the first rank; the result is broadcast to the replica
  (every rank returns the same rows, as the dispatch expects of a replica).
"""

from __future__ import annotations

import functools
import importlib
import os
from collections.abc import Callable, Iterable
from typing import Any

import torch

from rlctl.engines.rollout_batch import bucketed
from rlctl.errors import UserError
from rlctl.rank_order import rank_grid

LOCAL_SERIALIZED = (  # where LocalSerializedTensor lives: 0.5.23, then 0.5.3
    "sglang.srt.model_executor.model_runner_components.weight_updater",
    "sglang.srt.model_executor.model_runner",
)


def local_serialized_tensor() -> type:
    """The installed SGLang's ``LocalSerializedTensor`` (it moved between 0.5.3 and 0.5.23)."""
    for path in LOCAL_SERIALIZED:
        try:
            found = getattr(importlib.import_module(path), "LocalSerializedTensor", None)
        except ImportError:
            continue
        if found is not None:
            return found
    raise UserError("rollout.tensor_parallel > 1 with rollout.engine = 'sglang': this SGLang has no LocalSerializedTensor")


def from_leader(method: Callable) -> Callable:
    """Run ``method`` on the replica's first rank and broadcast its result to the replica."""

    @functools.wraps(method)
    def wrapped(self, *args, **kwargs):
        if getattr(self, "tp", 1) == 1:
            return method(self, *args, **kwargs)
        import torch.distributed as dist

        out = [method(self, *args, **kwargs) if self.engine is not None else None]
        dist.broadcast_object_list(out, src=self.leader_rank, group=self.tp_group)
        return out[0]

    return wrapped


def own_device() -> tuple[str, list[str]]:
    """This rank's device and the devices it sees, as names every rank of a node agrees on: CUDA
    device UUIDs (``str(torch.cuda.get_device_properties(i).uuid)``: torch's ``_CUuuid.__str__``,
    ``torch/csrc/cuda/Module.cpp``, the 8-4-4-4-12 form on CUDA and HIP); without CUDA, the local rank
    among the node's ranks (what a rank would address if it saw the node's devices)."""
    if torch.cuda.is_available():
        seen = [str(torch.cuda.get_device_properties(i).uuid) for i in range(torch.cuda.device_count())]
        return seen[torch.cuda.current_device()], seen
    local, local_world = int(os.environ.get("LOCAL_RANK", 0)), int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    return str(local), [str(i) for i in range(local_world)]


def progression(devices: list[int]) -> tuple[int, int] | None:
    """``(base_gpu_id, gpu_id_step)`` with ``devices[i] == base + i * step`` (SGLang's scheduler of
    TP rank ``i`` runs on that device, ``entrypoints/engine.py`` 0.5.3 and 0.5.23; step >= 1, its
    ``server_args`` check), or None where the devices are no such progression."""
    base = devices[0]
    step = devices[1] - base if len(devices) > 1 else 1
    if step < 1 or any(d != base + i * step for i, d in enumerate(devices)):
        return None
    return base, step


def replica_gpu_ids(tp_group, where: str) -> tuple[int, int]:
    """The ``base_gpu_id`` and ``gpu_id_step`` that put TP rank ``i``'s scheduler on the device of
    the replica's rank ``i``, as indices among the devices the replica's first rank sees. Every
    rank of the replica computes the same answer (or the same one-line UserError)."""
    import torch.distributed as dist

    mine = own_device()
    everyone: list = [None] * dist.get_world_size(tp_group)
    dist.all_gather_object(everyone, mine, group=tp_group)
    seen = everyone[0][1]  # what the replica's first rank, which starts the engine, sees
    missing = [
        f"rank {dist.get_global_rank(tp_group, i)}'s device {name}" for i, (name, _) in enumerate(everyone) if name not in seen
    ]
    if missing:
        raise UserError(
            f"{where}: the replica's first rank does not see {', '.join(missing)} (it sees {len(seen)} "
            "device(s)); one engine drives the replica's devices, so each rank must see its node's"
        )
    devices = [seen.index(name) for name, _ in everyone]
    found = progression(devices)
    if found is None:
        raise UserError(
            f"{where}: the replica's devices {devices} (indices among those its first rank sees: "
            f"{', '.join(name for name, _ in everyone)}) are not evenly spaced and ascending; SGLang puts "
            "TP rank i on base_gpu_id + i * gpu_id_step"
        )
    return found


class SGLangTensorParallel:
    """What :class:`~rlctl.engines.sglang_rollout.SGLangRolloutEngine` adds at TP > 1 (``self.tp``)."""

    tp: int = 1
    node_devices_at_tp = True  # one rank starts the replica's engine: it must see the replica's devices
    engine: Any
    reshard_format = "hf"  # every rank of a replica sends full tensors: SGLang's loaders cut them

    def _tp_setup(self, tp: int, rank_order: str, fields: Iterable[str]) -> dict[str, Any]:
        """This rank's place in its replica, and the ``Engine`` keywords for the replica's first rank."""
        import torch.distributed as dist

        self.tp, self.engine = tp, None
        if tp == 1:
            self.leader_rank = None
            return {}
        where = f"rollout.tensor_parallel = {tp} with rollout.engine = 'sglang'"
        if rank_order != "contiguous":
            raise UserError(f"{where}: one engine drives devices base_gpu_id..+{tp - 1}; rank order {rank_order!r} is not possible")
        if not (dist.is_available() and dist.is_initialized()):
            raise UserError(f"{where}: no initialised process group (the replica's ranks feed one engine)")
        world, rank = dist.get_world_size(), dist.get_rank()
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        if world % tp or local_world % tp:
            raise UserError(f"{where}: {tp} does not divide the {local_world} ranks of a node (one engine per replica, inside a node)")
        self.leader_rank = rank - rank % tp
        self.tp_group = None
        for ranks in rank_grid(world, tp, "contiguous"):  # every rank creates every group, in order
            group = dist.new_group(ranks)
            if rank in ranks:
                self.tp_group = group
        missing = {"tp_size", "base_gpu_id"} - set(fields)
        if missing:
            raise UserError(f"{where}: this SGLang's ServerArgs lacks {', '.join(sorted(missing))}")
        base, step = replica_gpu_ids(self.tp_group, where)
        if step != 1 and "gpu_id_step" not in set(fields):
            raise UserError(f"{where}: the replica's devices are {step} apart and this SGLang has no gpu_id_step")
        return {"tp_size": tp, "base_gpu_id": base, **({"gpu_id_step": step} if "gpu_id_step" in set(fields) else {})}

    @torch.no_grad()
    def feed_replica(self, stream: Iterable[tuple[str, torch.Tensor]], load: Callable[[list, bool], None]) -> int:
        """Every rank of the replica sends its full tensors, bucket by bucket, to the first rank,
        which hands each TP scheduler the tensor of the trainer rank on its device (``load``:
        ``update_weights_from_tensor`` of ``[(name, LocalSerializedTensor)]``, flushing the cache
        with the last bucket)."""
        import torch.distributed as dist

        serializer = importlib.import_module("sglang.srt.utils").MultiprocessingSerializer
        wrap = local_serialized_tensor()
        count, pending, patched = 0, None, False
        for bucket in bucketed(stream, self.bucket_bytes):
            if not patched and any(t.is_cuda for _, t in bucket):
                # CUDA IPC handles carry the device's UUID, not this process's index of it
                # (``sglang/srt/utils/patch_torch.py``, 0.5.3 and 0.5.23; what weight_sync does first)
                importlib.import_module("sglang.srt.utils.patch_torch").monkey_patch_torch_reductions()
                patched = True
            mine = [(name, serializer.serialize(t.detach())) for name, t in bucket]
            gathered = [None] * self.tp if self.engine is not None else None
            dist.gather_object(mine, gathered, dst=self.leader_rank, group=self.tp_group)
            if gathered is not None:
                named = [(parts[0][0], wrap(values=[p[1] for p in parts])) for parts in zip(*gathered, strict=True)]
                if pending is not None:
                    load(pending, False)
                pending = named
            count += len(bucket)
        if pending is not None:
            load(pending, True)
        return count
