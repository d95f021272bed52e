"""FSDP2 wrapping of a training engine's model: ``fully_shard`` per decoder block, activation
checkpointing (both applied before the weights are loaded, see :mod:`rlctl.engines.fsdp_load`)."""

from __future__ import annotations

import torch
from torch import nn


def _shard(model: nn.Module, mesh, compute: torch.dtype | None, cpu_offload: bool, device: str) -> None:
    """``fully_shard`` each no-split block (HF ``_no_split_modules``), then the root.

    Under mixed precision the all-gathered parameters are cast to ``compute`` and gradients are
    reduce-scattered in fp32 into the fp32 shards; a critic's value head gets an fp32 policy of its
    own so values are not rounded to the compute dtype.
    """
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    kwargs: dict = {"mesh": mesh}
    if compute is not None:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=torch.float32)
    if cpu_offload and device != "cpu":
        kwargs["offload_policy"] = CPUOffloadPolicy()
    block_names = set(getattr(model, "_no_split_modules", None) or [])
    blocks = [m for m in model.modules() if type(m).__name__ in block_names]
    for block in blocks:
        fully_shard(block, **kwargs)
    head = getattr(model, "value_head", None)
    if compute is not None and isinstance(head, nn.Module):
        fp32 = MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32)
        fully_shard(head, **{**kwargs, "mp_policy": fp32})
    fully_shard(model, **kwargs)


def enable_activation_checkpointing(model: nn.Module, value_head: bool) -> None:
    target = model.backbone if value_head else model
    if hasattr(target, "activation_checkpointing_enable"):  # transformers >= 5.x name
        target.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        target.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
