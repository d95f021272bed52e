"""Tensor parallelism for the HF rollout engine: the model's own TP plan applied over a device mesh.

A transformers model declares how its layers split (``config.base_model_tp_plan``: q/k/v and
gate/up ``colwise``, o/down ``rowwise``; the causal-LM head in the class's ``_tp_plan``). rlctl
applies that plan with torch's own parallel styles (``torch.distributed.tensor.parallel``), the
ones transformers builds its styles on, over the TP axis of a ``(dp, tp)`` device mesh built from
the policy's process group, and adds a vocabulary-parallel embedding (the tied LM head then shares
its shard, as vLLM's ``VocabParallelEmbedding`` does). Parameters become ``Shard`` DTensors, so each
rank stores ``1/tp`` of every split weight; the model is built on the meta device and only the local
shards are ever allocated: the weight sync (:mod:`rlctl.reshard`, layout ``hf_tp``) writes them in
place.

Why torch's styles rather than ``from_pretrained(tp_plan="auto")``: that path builds its own mesh
over the whole job (transformers 5.25 ``distributed/utils.py: initialize_distributed_mesh``), while a
rollout replica is a sub-group of the trainer's ranks, and it loads weights from disk that the sync
overwrites. The plan is read from the model, so a model without one is refused by name.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from rlctl.engines import fsdp_load
from rlctl.errors import UserError

RANK_ORDERS = ("contiguous", "strided")
# the transformers plan styles this engine maps onto torch's (transformers 5.25
# distributed/tensor_parallel.py ALL_PARALLEL_STYLES: "colwise" Shard(0) weight, output sharded;
# "rowwise" Shard(-1) weight, replicated bias, output all-reduced; "colwise_rep" /
# "colwise_gather_output": Shard(0), output gathered)
# "embedding_rowwise": Shard(0) embedding rows, output all-reduced)
LAYER_STYLES = ("colwise", "rowwise", "embedding_rowwise")
HEAD_STYLES = ("colwise_rep", "colwise_gather_output")


def declared_plan(model: nn.Module) -> dict[str, str]:
    """The model's TP plan as ``{module name pattern: style}`` with full module paths, or a
    UserError naming the model type when it declares none or uses a style this engine cannot run."""
    config = model.config
    base = dict(getattr(config, "base_model_tp_plan", None) or {})
    kind = getattr(config, "model_type", type(model).__name__)
    if not base:
        raise UserError(
            f"rollout.tensor_parallel > 1: model type {kind!r} declares no tensor-parallel plan "
            "(config.base_model_tp_plan); the HF rollout engine needs one, so set rollout.tensor_parallel = 1"
        )
    prefix = getattr(model, "base_model_prefix", "model")
    plan = {f"{prefix}.{k}": v for k, v in base.items()}
    plan.update(dict(getattr(model, "_tp_plan", None) or {}))
    for name, style in plan.items():
        if style not in LAYER_STYLES + HEAD_STYLES:
            raise UserError(
                f"rollout.tensor_parallel > 1: model type {kind!r} splits {name!r} as {style!r}, which "
                f"the HF rollout engine does not run (it runs {', '.join(LAYER_STYLES + HEAD_STYLES)})"
            )
    return plan


def rollout_mesh(device_type: str, world: int, tp: int, rank_order: str = "contiguous"):
    """The ``(dp, tp)`` DeviceMesh of ``world`` ranks in replicas of ``tp``: contiguous TP groups
    (ranks ``[d*tp, (d+1)*tp)``, what vLLM and verl launch) or strided ones (``{d, d+dp, ...}``,
    HybridFlow's). Every rank of the default group must call this together."""
    from torch.distributed.device_mesh import DeviceMesh

    if rank_order not in RANK_ORDERS:
        raise UserError(f"rollout rank order {rank_order!r}; expected one of {', '.join(RANK_ORDERS)}")
    if tp < 1 or world % tp:
        raise UserError(f"rollout.tensor_parallel = {tp} does not divide the {world} ranks")
    dp = world // tp
    grid = (
        torch.arange(world).view(dp, tp) if rank_order == "contiguous" else torch.arange(world).view(tp, dp).T
    )
    return DeviceMesh(device_type, grid.contiguous(), mesh_dim_names=("dp", "tp"))


def _matches(pattern: str, name: str) -> bool:
    parts, names = pattern.split("."), name.split(".")
    return len(parts) == len(names) and all(p in ("*", n) for p, n in zip(parts, names, strict=True))


def apply_plan(model: nn.Module, tp_mesh, plan: Mapping[str, str]) -> nn.Module:
    """Split ``model`` (parameters anywhere, meta included) over the 1-D ``tp_mesh`` by ``plan``,
    plus a vocabulary-parallel input embedding. A tied LM head is split like the embedding
    (``Shard(0)`` over the vocabulary), so :func:`materialize` re-ties the two to one shard."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    styles = {
        "colwise": lambda: ColwiseParallel(),
        "rowwise": lambda: RowwiseParallel(),
        "colwise_rep": lambda: ColwiseParallel(output_layouts=Replicate()),
        "colwise_gather_output": lambda: ColwiseParallel(output_layouts=Replicate()),
        "embedding_rowwise": lambda: RowwiseParallel(input_layouts=Replicate()),
    }
    layout = {}
    for name, module in model.named_modules():
        style = next((s for p, s in plan.items() if _matches(p, name)), None)
        if style is not None and isinstance(module, nn.Linear | nn.Embedding):
            layout[name] = styles[style]()
    embed = model.get_input_embeddings()
    embed_name = next(n for n, m in model.named_modules() if m is embed)
    layout[embed_name] = RowwiseParallel(input_layouts=Replicate())  # vocabulary rows, output all-reduced
    parallelize_module(model, tp_mesh, layout)
    return model


def materialize(model: nn.Module, device: torch.device, tied: bool) -> None:
    """Allocate only the local shards on ``device`` (uninitialised: the sync fills them), keep the
    buffers ``__init__`` computed (rotary frequencies are in no checkpoint), re-tie the LM head."""
    buffers = fsdp_load.snapshot_buffers(model)
    model.to_empty(device=device)
    fsdp_load.restore_buffers(model, buffers, device)
    if tied:
        model.get_output_embeddings().weight = model.get_input_embeddings().weight


def local(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (the storage this rank holds), or the tensor itself."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def build_meta_model(source, *, dtype: str, trust_remote_code: bool, attn_implementation: str) -> nn.Module:
    """The causal LM of ``source``'s config, parameters on the meta device, buffers real."""
    return fsdp_load.build_meta_model(
        source,
        dtype=dtype,
        trust_remote_code=trust_remote_code,
        attn_implementation=attn_implementation,
        value_head=False,
    )
