"""Reshard: actor weights from the training layout to the rollout layout, in memory, bucketed.

Layer: pure layout arithmetic plus ``torch.distributed`` collectives; it knows no engine.

Pieces
------
* :mod:`.model` - :func:`spec_from_config` (``transformers`` config or plain dict) -> :class:`ModelSpec`
  with the full HF parameter list of a Llama/Qwen2-family decoder.
* :mod:`.layout` - :class:`Layout`: per rank, local tensors made of HF blocks. Builders:
  :func:`fsdp_layout` (FSDP2 ``fully_shard`` dim-0 shards, ``torch.chunk`` semantics, empty trailing
  shards kept), :func:`megatron_layout` (TP column/row, described), :func:`rollout_layout` (vLLM TP:
  merged head-aware ``qkv_proj`` with GQA kv-head replication ``kv = tp_rank // (tp / num_kv)``,
  ``gate_up_proj``, row-parallel ``o_proj``/``down_proj`` with replicated biases, vocab-parallel
  embedding / LM head padded to a multiple of 64 globally then split evenly, padding rows zero, tied LM
  head omitted, replicated norms; or ``fmt="hf"``: full unmerged HF names for the HF rollout engine).
* :mod:`.plan` - :func:`make_plan`: per rank what it sends/receives (blocks, offsets), in rounds whose
  send+receive bytes per rank stay within ``bucket_bytes``.
* :mod:`.executor` - runs a plan on one rank with one ``all_to_all_single`` per bucket, or with
  ``batch_isend_irecv`` per piece (contiguous pieces sent/received in place; faster on gloo).
* :mod:`.loopback` - runs a plan for all ranks in one process (tests, single-device debugging).
* :mod:`.baselines` - naive all-gather and disk (safetensors) reshards for ``rlctl bench reshard``.

Ranks
-----
``world = max(p, q)`` ranks take part; train rank ``r < p`` holds FSDP shard ``r``. With ``p >= q`` there
are ``p / q`` rollout replicas, each a full TP set; TP groups are contiguous (``rank_order="contiguous"``,
tp rank ``r % q``, what vLLM/verl launch) or HybridFlow-strided (``"strided"``, tp rank ``r // (p/q)``,
fewer bytes cross ranks). With ``q > p`` ranks ``p..q-1`` hold no train shard and only receive.

API the engines call (colocated actor -> rollout update)
--------------------------------------------------------
::

    for bucket in reshard_train_to_rollout(
        model_config,                    # PretrainedConfig, dict, or ModelSpec
        train_world=p, rank=rank, rollout_tp=q,
        local_shards={hf_name: dtensor_or_tensor for hf_name, ... in fsdp_model.named_parameters()},
        bucket_bytes=256 << 20,          # bound on extra comm buffers per rank
        group=None,                      # torch.distributed group spanning the world ranks
        rank_order="contiguous",         # must match how the rollout engine's TP groups are formed
        fmt="vllm",                      # or "hf" (q == 1, HF names, unmerged)
        out=None,                        # optional: rollout name -> engine tensor to fill in place
        transport="auto",                # p2p (batch_isend_irecv) on gloo, all_to_all_single elsewhere
    ):
        rollout_engine.load(bucket)      # list of (rollout_param_name, local tensor); then drop it

Every rank of ``group`` must iterate the generator to the end (each round is a collective).
:func:`reshard_rollout_to_train` is the inverse move (used by tests to prove bit-exactness).
"""

from rlctl.reshard.api import (
    DEFAULT_BUCKET_BYTES,
    choose_rank_order,
    reshard_rollout_to_train,
    reshard_train_to_rollout,
    train_to_rollout_plan,
    world_for,
)
from rlctl.reshard.layout import Block, Layout, LocalTensor, fsdp_layout, megatron_layout, rollout_layout
from rlctl.reshard.model import ModelSpec, spec_from_config
from rlctl.reshard.plan import Plan, make_plan

__all__ = [
    "DEFAULT_BUCKET_BYTES",
    "Block",
    "Layout",
    "LocalTensor",
    "ModelSpec",
    "choose_rank_order",
    "Plan",
    "fsdp_layout",
    "make_plan",
    "megatron_layout",
    "reshard_rollout_to_train",
    "reshard_train_to_rollout",
    "rollout_layout",
    "spec_from_config",
    "train_to_rollout_plan",
    "world_for",
]
