"""vLLM at rollout tensor parallelism ``q > 1``, colocated: every trainer rank is one vLLM TP worker.

Written against vLLM 0.13.0 and 0.33.0 (paths inside the wheels; 0.10.2, the floor, has the same
executor in ``vllm/executor/uniproc_executor.py``, the same group cut and loaders); not yet run on
NVIDIA hardware, tested against fakes that hold per-rank shards as those releases' loaders do.

- ``LLM(tensor_parallel_size=q, distributed_executor_backend="external_launcher")`` builds
  ``ExecutorWithExternalLauncher`` (``v1/executor/uniproc_executor.py``): one worker in this process,
  its rank and local rank from ``RANK`` / ``LOCAL_RANK`` (``env://``; rlctl's workers set both). It
  asserts ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (``config/parallel.py`` sets it for this backend too),
  so ``collective_rpc`` runs the worker's method here and returns ``[result]``: tensors by reference.
- With torch.distributed already initialised by the trainer, vLLM reuses its world
  (``distributed/parallel_state.py`` ``init_distributed_environment``) and cuts TP groups out of it
  as ``arange(world).reshape(-1, dp, pp, [pcp,] q)`` (``initialize_model_parallel``): contiguous
  ranks ``[d*q, (d+1)*q)``, TP rank ``rank % q``. HybridFlow's strided order is impossible here.
  Every rank of a TP group must call ``generate`` with the same prompts and seeds (verl and TRL give
  the TP group one seed); rlctl's dispatch hands each replica's ranks the same rows and seed.
- The weight feed writes rlctl's planned shards (``reshard`` layout ``vllm``: merged
  ``qkv_proj`` / ``gate_up_proj``, vocabulary padded to 64 then split) straight into the worker's
  parameters (``model.named_parameters()``), instead of streaming full tensors into
  ``load_weights`` (which every TP rank would receive whole and narrow): see docs/rollout-tp.md.
  The parameter references taken once stay valid across ``sleep``/``wake_up``: the sleep-mode
  allocator unmaps and remaps physical memory at the same virtual addresses
  (``device_allocator/cumem.py`` ``CuMemAllocator.wake_up``, 0.33.0).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from rlctl.engines import tp_shards
from rlctl.engines.fingerprint import fingerprint_sharded
from rlctl.engines.vllm_worker import RlctlWorkerExtension
from rlctl.errors import RunError, UserError
from rlctl.rank_order import rank_grid

EXECUTOR = "external_launcher"
TP_EXTENSION = "rlctl.engines.vllm_tp.RlctlTPWorkerExtension"


class RlctlTPWorkerExtension(RlctlWorkerExtension):
    """The worker extension at TP > 1: also hands out the worker's own parameters."""

    def rlctl_local_tensors(self) -> dict[str, torch.Tensor]:
        """vLLM name -> this TP rank's parameter (each storage once, as the model registers it)."""
        return dict(self.rlctl_model().named_parameters())

    def rlctl_hf_config(self):
        """The model's HF config (``WorkerBase.model_config.hf_config``, 0.13.0 and 0.33.0)."""
        return self.model_config.hf_config


def tp_group(tp: int):
    """This rank's TP group as vLLM cuts it (contiguous ranks); every rank calls this together."""
    import torch.distributed as dist

    world, rank = dist.get_world_size(), dist.get_rank()
    mine = None
    for ranks in rank_grid(world, tp, "contiguous"):  # every rank creates every group, in order
        group = dist.new_group(ranks)
        if rank in ranks:
            mine = group
    return mine


def launcher_kwargs(tp: int, rank_order: str, fields: Iterable[str], version: str) -> dict[str, Any]:
    """The ``LLM`` keywords that make this process TP rank ``rank % tp`` of a replica of ``tp``
    ranks; a UserError when the trainer's world cannot hold it that way."""
    import torch.distributed as dist

    if tp == 1:
        return {}
    where = f"rollout.tensor_parallel = {tp} with rollout.engine = 'vllm'"
    if "distributed_executor_backend" not in set(fields):
        raise UserError(f"{where}: vllm {version} has no EngineArgs.distributed_executor_backend")
    if rank_order != "contiguous":
        raise UserError(
            f"{where}: vLLM cuts contiguous TP groups out of the trainer's world "
            f"(distributed/parallel_state.py); rank order {rank_order!r} is not possible"
        )
    if not (dist.is_available() and dist.is_initialized()):
        raise UserError(f"{where}: no initialised process group (vLLM's external launcher joins the trainer's)")
    world, rank = dist.get_world_size(), dist.get_rank()
    if world % tp:
        raise UserError(f"{where}: {tp} does not divide the {world} ranks")
    if os.environ.get("RANK") != str(rank):  # ExecutorWithExternalLauncher._distributed_args reads it
        os.environ["RANK"] = str(rank)
    # the worker's device is cuda:LOCAL_RANK among the visible ones (v1/worker/gpu_worker.py
    # init_device): this rank's own device, which under Ray is the only one it sees
    os.environ["LOCAL_RANK"] = str(torch.cuda.current_device() if torch.cuda.is_available() else 0)
    return {
        "tensor_parallel_size": tp,
        "distributed_executor_backend": EXECUTOR,
        "worker_extension_cls": TP_EXTENSION,
    }


class VLLMTensorParallel:
    """What :class:`~rlctl.engines.vllm_rollout.VLLMRolloutEngine` adds at TP > 1 (``self.tp``)."""

    tp: int = 1
    reshard_format = "vllm"  # the planned sync's layout: vLLM's own TP shards
    llm: Any

    def _tp_setup(self) -> None:
        """After ``LLM(...)``: this rank's parameters, its TP rank and group, the model's sizes."""
        import torch.distributed as dist

        (self._local,) = self.llm.collective_rpc("rlctl_local_tensors")
        (config,) = self.llm.collective_rpc("rlctl_hf_config")
        self.tp_rank = dist.get_rank() % self.tp
        self.tp_group = tp_group(self.tp)
        self._heads = tp_shards.Heads.of(config)

    def local_tensors(self) -> dict[str, torch.Tensor]:
        """vLLM name -> the tensor this rank stores for it: what the planned sync fills in place."""
        return dict(self._local) if self.tp > 1 else {}

    @torch.no_grad()
    def update_shards(self, stream: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Take planned shards: the planner wrote into :meth:`local_tensors` (nothing to copy); a
        tensor given from elsewhere is copied into the parameter of its name. Drops the prefix cache."""
        count = 0
        for name, tensor in stream:
            local = self._local.get(name)
            if local is None or tuple(local.shape) != tuple(tensor.shape):
                raise RunError(f"vLLM TP rank {self.tp_rank}: no parameter {name!r} of shape {tuple(tensor.shape)}")
            if local.data_ptr() != tensor.data_ptr():
                local.copy_(tensor)
            count += 1
        self.llm.reset_prefix_cache()
        return count

    def tp_fingerprint(
        self, spec: Sequence[tuple[str, tuple[int, ...]]], salt: int = 0
    ) -> dict[str, tuple[float, float, str] | None]:
        """Each rank reads the HF rows its parameters hold (:mod:`.tp_shards`); the TP group adds
        the partial sums, so a shard one rank missed fails on every rank of the replica."""
        params, splits = tp_shards.views(spec, self._local, self._heads, self.tp, self.tp_rank)
        return fingerprint_sharded(spec, params, splits, self.tp_group, salt)
