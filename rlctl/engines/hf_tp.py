"""Tensor parallelism for the HF rollout engine: the model's own TP plan, run on local shards.

A transformers model declares how its layers split (``config.base_model_tp_plan``: q/k/v and
gate/up ``colwise``, o/down ``rowwise``; the causal-LM head in the class's ``_tp_plan``). This
module applies that plan over one TP group of the policy's ranks, vLLM-style: each split
parameter is replaced by this rank's piece (``torch.chunk`` rows or columns, plain tensors), and
the modules that need a collective get a forward that runs it - a row-parallel linear all-reduces
its partial sums, the LM head all-gathers the vocabulary, and the input embedding is
vocabulary-parallel (a tied LM head shares its shard, as vLLM's ``VocabParallelEmbedding`` does).
Attention needs nothing: q/k/v hold whole heads, and transformers' attention reshapes with ``-1``
heads. The model is built on the meta device and only the local pieces are allocated, uninitialised:
the weight sync (:mod:`rlctl.reshard`, layout ``hf_tp``) writes them in place.

Why not transformers' own ``from_pretrained(tp_plan="auto")``: that path builds a mesh over the
whole job (transformers 5.25 ``distributed/utils.py: initialize_distributed_mesh``) while a rollout
replica is a sub-group of the trainer's ranks, it loads weights from disk that the sync then
overwrites, and it computes through DTensor dispatch (torch's parallel styles on 2 gloo ranks made
a tiny model's decode step ~20x slower than these plain local ops). The plan is still the model's:
a model that declares none is refused by name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from rlctl.engines import fsdp_load
from rlctl.errors import UserError
from rlctl.rank_order import rank_grid

# the transformers plan styles run here (transformers 5.25 distributed/tensor_parallel.py
# ALL_PARALLEL_STYLES): "colwise" rows of weight and bias, output sharded; "rowwise" weight
# columns, bias whole, output all-reduced; "colwise_rep"/"colwise_gather_output" rows, output
# gathered; "embedding_rowwise" vocabulary rows, output all-reduced
COLUMN_STYLES = ("colwise",)
ROW_STYLES = ("rowwise",)
GATHER_STYLES = ("colwise_rep", "colwise_gather_output")
EMBED_STYLES = ("embedding_rowwise",)
STYLES = COLUMN_STYLES + ROW_STYLES + GATHER_STYLES + EMBED_STYLES


@dataclass(frozen=True)
class Split:
    """How one parameter is split over the TP group: along ``dim``, this rank holding indices
    ``[start, start + its size)`` of the full tensor of shape ``full``."""

    dim: int
    start: int
    full: tuple[int, ...]


def chunk_range(n: int, parts: int, index: int) -> tuple[int, int]:
    """``torch.chunk``'s piece ``index`` of ``n`` (``ceil(n / parts)`` each, the last shorter or empty)."""
    size = -(-n // parts) if n else 0
    return min(index * size, n), min((index + 1) * size, n)


def declared_plan(model: nn.Module) -> dict[str, str]:
    """The model's TP plan as ``{module path pattern: style}``, or a UserError naming the model type
    when it declares none or splits a layer in a way this engine does not run."""
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
        if style not in STYLES:
            raise UserError(
                f"rollout.tensor_parallel > 1: model type {kind!r} splits {name!r} as {style!r}, which "
                f"the HF rollout engine does not run (it runs {', '.join(STYLES)})"
            )
    return plan


def rollout_mesh(device_type: str, world: int, tp: int, rank_order: str = "contiguous"):
    """The ``(dp, tp)`` DeviceMesh of ``world`` ranks in replicas of ``tp``: contiguous TP groups
    (ranks ``[d*tp, (d+1)*tp)``, what vLLM and verl launch) or strided ones (``{d, d+dp, ...}``,
    HybridFlow's; :mod:`rlctl.rank_order`). Every rank of the default group must call this together."""
    from torch.distributed.device_mesh import DeviceMesh

    if tp < 1 or world % tp:
        raise UserError(f"rollout.tensor_parallel = {tp} does not divide the {world} ranks")
    return DeviceMesh(device_type, torch.tensor(rank_grid(world, tp, rank_order)), mesh_dim_names=("dp", "tp"))


def _matches(pattern: str, name: str) -> bool:
    parts, names = pattern.split("."), name.split(".")
    return len(parts) == len(names) and all(p in ("*", n) for p, n in zip(parts, names, strict=True))


def _split_param(module: nn.Module, pname: str, dim: int, tp: int, rank: int) -> Split:
    """Replace ``module.<pname>`` with this rank's piece along ``dim`` (same device, no values)."""
    param = getattr(module, pname)
    full = tuple(param.shape)
    a, b = chunk_range(full[dim], tp, rank)
    shape = list(full)
    shape[dim] = b - a
    piece = torch.empty(shape, dtype=param.dtype, device=param.device)
    setattr(module, pname, nn.Parameter(piece, requires_grad=False))
    return Split(dim, a, full)


def apply_plan(model: nn.Module, plan: Mapping[str, str], group, tp: int, rank: int) -> dict[str, Split]:
    """Split ``model`` (meta parameters) by ``plan`` for TP rank ``rank`` of ``group``, with a
    vocabulary-parallel input embedding; returns each split parameter's :class:`Split` by HF name
    (a tied LM head's under both names)."""
    embed, head = model.get_input_embeddings(), model.get_output_embeddings()
    tied = head is not None and head.weight is embed.weight
    splits: dict[str, Split] = {}
    for name, module in list(model.named_modules()):
        style = (
            "embedding_rowwise"
            if module is embed
            else next((s for p, s in plan.items() if _matches(p, name)), None)
        )
        if style is None:
            continue
        if type(module) not in (nn.Linear, nn.Embedding):  # a subclass may compute more in forward()
            raise UserError(
                f"rollout.tensor_parallel > 1: {name!r} is a {type(module).__name__}, which the HF engine "
                "cannot split (it splits plain torch Linear and Embedding layers); set rollout.tensor_parallel = 1"
            )
        dim = 1 if style in ROW_STYLES else 0
        for pname in ("weight", "bias"):
            if getattr(module, pname, None) is None or (pname == "bias" and style in ROW_STYLES):
                continue
            if module is head and tied:
                continue  # re-tied to the embedding's piece below
            splits[f"{name}.{pname}"] = _split_param(module, pname, dim, tp, rank)
        if style in ROW_STYLES:
            module.forward = _row_parallel(module, group)
        elif style in GATHER_STYLES:
            module.forward = _gathered(module, group, tp, module.out_features)
        elif style in EMBED_STYLES:
            module.forward = _vocab_parallel(module, group, splits[f"{name}.weight"].start)
    if tied:
        head_name = next(n for n, m in model.named_modules() if m is head)
        embed_name = next(n for n, m in model.named_modules() if m is embed)
        head.weight = embed.weight
        splits[f"{head_name}.weight"] = splits[f"{embed_name}.weight"]
        if not any(_matches(p, head_name) for p in plan):
            head.forward = _gathered(head, group, tp, embed.num_embeddings)
    return splits


def _row_parallel(module: nn.Linear, group) -> Callable[[torch.Tensor], torch.Tensor]:
    """Input columns in, partial sums all-reduced, the whole bias added once."""
    import torch.distributed as dist

    def forward(x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, module.weight)
        dist.all_reduce(y, group=group)
        return y if module.bias is None else y + module.bias

    return forward


def _gathered(module: nn.Linear, group, tp: int, full_out: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """This rank's output columns, all-gathered into the full width (pieces padded to one size)."""
    import torch.distributed as dist

    size = -(-full_out // tp)

    def forward(x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, module.weight, module.bias)
        if y.shape[-1] < size:
            y = F.pad(y, (0, size - y.shape[-1]))
        parts = [torch.empty_like(y) for _ in range(tp)]
        dist.all_gather(parts, y.contiguous(), group=group)
        return torch.cat(parts, dim=-1)[..., :full_out]

    return forward


def _vocab_parallel(module: nn.Embedding, group, start: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """Rows ``[start, start + n)`` of the vocabulary: ids outside give zeros, then the group sums."""
    import torch.distributed as dist

    def forward(ids: torch.Tensor) -> torch.Tensor:
        rows = module.weight.shape[0]
        inside = (ids >= start) & (ids < start + rows)
        if rows:
            out = F.embedding((ids - start).clamp(0, rows - 1), module.weight) * inside.unsqueeze(-1)
        else:
            out = module.weight.new_zeros((*ids.shape, module.weight.shape[1]))
        dist.all_reduce(out, group=group)
        return out

    return forward


def materialize(model: nn.Module, device: torch.device, tied: bool) -> None:
    """Allocate the local pieces on ``device`` (uninitialised: the sync fills them), keep the
    buffers ``__init__`` computed (rotary frequencies are in no checkpoint), re-tie the LM head."""
    buffers = fsdp_load.snapshot_buffers(model)
    model.to_empty(device=device)
    fsdp_load.restore_buffers(model, buffers, device)
    if tied:
        model.get_output_embeddings().weight = model.get_input_embeddings().weight


def build_meta_model(source, *, dtype: str, trust_remote_code: bool, attn_implementation: str) -> nn.Module:
    """The causal LM of ``source``'s config, parameters on the meta device, buffers real."""
    return fsdp_load.build_meta_model(
        source,
        dtype=dtype,
        trust_remote_code=trust_remote_code,
        attn_implementation=attn_implementation,
        value_head=False,
    )
