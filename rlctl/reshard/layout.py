"""Layouts: where each piece of each HF parameter lives, per rank.

A layout maps every rank to its local tensors; each local tensor is a stack (along dim 0) of
rectangular :class:`Block` s cut from HF parameters, plus zero rows where the layout pads (vocab
padding). Every parameter is viewed as 2-D ``(shape[0], prod(shape[1:]))``; 1-D parameters have a
single column. This one description covers FSDP2 dim-0 shards, Megatron TP and vLLM's TP layout, so
one planner moves data between any two of them.

Rollout rank mapping (``rank_order``, defined in :mod:`rlctl.rank_order`) for a world of ``W``
ranks and TP degree ``q`` (``W % q == 0``, ``W // q`` rollout replicas, each a full TP set):

* ``"contiguous"`` (default, what vLLM/verl launch): TP group ``d`` is ranks ``[d*q, (d+1)*q)``;
  rollout TP rank of rank ``r`` is ``r % q``.
* ``"strided"`` (HybridFlow's grouping): TP group ``d`` is ranks ``{d, d+W/q, d+2W/q, ...}``; rollout
  TP rank is ``r // (W/q)``. With FSDP dim-0 shards this puts most of what a rank needs on itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlctl.errors import UserError
from rlctl.rank_order import tp_rank_of
from rlctl.reshard.model import ModelSpec

VLLM_VOCAB_PADDING = 64  # vllm DEFAULT_VOCAB_PADDING_SIZE: global vocab padded to a multiple of 64
MEGATRON_VOCAB_DIVISOR = 128  # Megatron make_vocab_size_divisible_by (times TP size)


@dataclass(frozen=True)
class Block:
    """Rows ``[row0, row1)`` x cols ``[col0, col1)`` of HF parameter ``param``, placed at local row ``at``
    (local columns start at 0)."""

    param: str
    row0: int
    row1: int
    col0: int
    col1: int
    at: int

    @property
    def rows(self) -> int:
        return self.row1 - self.row0

    @property
    def cols(self) -> int:
        return self.col1 - self.col0


@dataclass(frozen=True)
class LocalTensor:
    """One tensor a rank holds: name, shape, and the HF blocks it is made of (other rows are zero)."""

    name: str
    shape: tuple[int, ...]
    blocks: tuple[Block, ...]

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def padded(self) -> bool:
        return sum(b.rows for b in self.blocks) < self.shape[0]


@dataclass(frozen=True)
class Layout:
    """Per rank, the ordered local tensors. ``kind`` names the layout for messages."""

    kind: str
    ranks: tuple[tuple[LocalTensor, ...], ...]

    @property
    def world(self) -> int:
        return len(self.ranks)

    def names(self, rank: int) -> list[str]:
        return [t.name for t in self.ranks[rank]]


def _cols(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape[1:]:
        n *= d
    return n


def _full(param: str, shape: tuple[int, ...], at: int = 0) -> Block:
    return Block(param, 0, shape[0], 0, _cols(shape), at)


def fsdp_shard_rows(n: int, world: int, rank: int) -> tuple[int, int]:
    """Rows FSDP2 ``fully_shard`` gives ``rank``: ``torch.chunk(dim=0)`` semantics (uneven, maybe empty)."""
    size = -(-n // world) if n else 0
    return min(rank * size, n), min((rank + 1) * size, n)


def fsdp_layout(spec: ModelSpec, train_world: int, world: int | None = None) -> Layout:
    """FSDP2 dim-0 shards over ranks ``0..train_world-1``; ranks beyond hold nothing."""
    world = world or train_world
    params = spec.hf_params()
    ranks = []
    for r in range(world):
        local = []
        if r < train_world:
            for name, shape in params.items():
                a, b = fsdp_shard_rows(shape[0], train_world, r)
                blocks = (Block(name, a, b, 0, _cols(shape), 0),) if b > a else ()
                local.append(LocalTensor(name, (b - a, *shape[1:]), blocks))
        ranks.append(tuple(local))
    return Layout(f"fsdp(p={train_world})", tuple(ranks))


def check_tp(spec: ModelSpec, tp: int, vocab_multiple: int = VLLM_VOCAB_PADDING) -> str | None:
    """Why ``spec`` cannot be split ``tp`` ways by vLLM's rules, or None when it can."""
    if tp < 1:
        return f"tp={tp} must be >= 1"
    if spec.num_heads % tp:
        return f"num_attention_heads={spec.num_heads} is not divisible by tp={tp}"
    kv = spec.num_kv_heads
    if (tp >= kv and tp % kv) or (tp < kv and kv % tp):
        return f"num_key_value_heads={kv} and tp={tp}: one must divide the other"
    if spec.intermediate_size % tp:
        return f"intermediate_size={spec.intermediate_size} is not divisible by tp={tp}"
    padded = -(-spec.vocab_size // vocab_multiple) * vocab_multiple
    if padded % tp:
        return f"vocab padded to {padded} (multiple of {vocab_multiple}) is not divisible by tp={tp}"
    return None


def _kv_shard(spec: ModelSpec, tp: int, t: int) -> tuple[int, int]:
    """(first kv row, kv rows) tp rank ``t`` loads: vLLM QKVParallelLinear, kv heads replicated if tp > kv."""
    if tp >= spec.num_kv_heads:
        heads, replicas = 1, tp // spec.num_kv_heads
    else:
        heads, replicas = spec.num_kv_heads // tp, 1
    size = heads * spec.head_dim
    return (t // replicas) * size, size


def _vocab_tensor(name: str, param: str, spec: ModelSpec, tp: int, t: int, multiple: int) -> LocalTensor:
    """Vocabulary rows of TP rank ``t``: padded to a multiple then split evenly (vLLM, Megatron),
    or with ``multiple=0`` ``torch.chunk``'s split (a DTensor ``Shard(0)``: the last ranks shorter)."""
    if multiple == 0:
        a, b = fsdp_shard_rows(spec.vocab_size, tp, t)
        blocks = (Block(param, a, b, 0, spec.hidden_size, 0),) if b > a else ()
        return LocalTensor(name, (b - a, spec.hidden_size), blocks)
    padded = -(-spec.vocab_size // multiple) * multiple
    per = padded // tp
    a, b = min(t * per, spec.vocab_size), min((t + 1) * per, spec.vocab_size)
    blocks = (Block(param, a, b, 0, spec.hidden_size, 0),) if b > a else ()
    return LocalTensor(name, (per, spec.hidden_size), blocks)


def _tp_rank_tensors(
    spec: ModelSpec, tp: int, t: int, merged: bool, vocab_multiple: int
) -> list[LocalTensor]:
    """One TP rank's tensors; ``merged`` = vLLM names (qkv_proj, gate_up_proj), else HF names."""
    h, i, hd = spec.hidden_size, spec.intermediate_size, spec.head_dim
    params = spec.hf_params()
    qrows = spec.num_heads // tp * hd
    kv0, kvrows = _kv_shard(spec, tp, t)
    irows = i // tp
    out = [
        _vocab_tensor("model.embed_tokens.weight", "model.embed_tokens.weight", spec, tp, t, vocab_multiple)
    ]
    for n in range(spec.num_layers):
        p = f"model.layers.{n}."
        a = p + "self_attn."
        m = p + "mlp."
        suffixes = ["weight"] + (["bias"] if spec.qkv_bias else [])
        for sfx in suffixes:
            cols = h if sfx == "weight" else 1
            shape = (qrows + 2 * kvrows, h) if sfx == "weight" else (qrows + 2 * kvrows,)
            q = Block(f"{a}q_proj.{sfx}", t * qrows, (t + 1) * qrows, 0, cols, 0)
            k = Block(f"{a}k_proj.{sfx}", kv0, kv0 + kvrows, 0, cols, qrows)
            v = Block(f"{a}v_proj.{sfx}", kv0, kv0 + kvrows, 0, cols, qrows + kvrows)
            if merged:
                out.append(LocalTensor(f"{a}qkv_proj.{sfx}", shape, (q, k, v)))
            else:
                for blk, rows in ((q, qrows), (k, kvrows), (v, kvrows)):
                    local = Block(blk.param, blk.row0, blk.row1, 0, cols, 0)
                    out.append(LocalTensor(blk.param, (rows, *shape[1:]), (local,)))
        qcols = spec.q_size // tp
        out.append(
            LocalTensor(
                f"{a}o_proj.weight",
                (h, qcols),
                (Block(f"{a}o_proj.weight", 0, h, t * qcols, (t + 1) * qcols, 0),),
            )
        )
        if spec.o_bias:
            out.append(LocalTensor(f"{a}o_proj.bias", (h,), (_full(f"{a}o_proj.bias", (h,)),)))
        for sfx in ["weight"] + (["bias"] if spec.mlp_bias else []):
            cols = h if sfx == "weight" else 1
            g = Block(f"{m}gate_proj.{sfx}", t * irows, (t + 1) * irows, 0, cols, 0)
            u = Block(f"{m}up_proj.{sfx}", t * irows, (t + 1) * irows, 0, cols, irows)
            tail = (h,) if sfx == "weight" else ()
            if merged:
                out.append(LocalTensor(f"{m}gate_up_proj.{sfx}", (2 * irows, *tail), (g, u)))
            else:
                out.append(LocalTensor(g.param, (irows, *tail), (g,)))
                out.append(
                    LocalTensor(u.param, (irows, *tail), (Block(u.param, u.row0, u.row1, 0, cols, 0),))
                )
        out.append(
            LocalTensor(
                f"{m}down_proj.weight",
                (h, irows),
                (Block(f"{m}down_proj.weight", 0, h, t * irows, (t + 1) * irows, 0),),
            )
        )
        if spec.mlp_bias:
            out.append(LocalTensor(f"{m}down_proj.bias", (h,), (_full(f"{m}down_proj.bias", (h,)),)))
        for norm in ("input_layernorm.weight", "post_attention_layernorm.weight"):
            out.append(LocalTensor(p + norm, (h,), (_full(p + norm, params[p + norm]),)))
    out.append(LocalTensor("model.norm.weight", (h,), (_full("model.norm.weight", (h,)),)))
    if not spec.tie_word_embeddings:
        out.append(_vocab_tensor("lm_head.weight", "lm_head.weight", spec, tp, t, vocab_multiple))
    return out


def check_hf_tp(spec: ModelSpec, tp: int) -> str | None:
    """Why ``spec`` cannot be split ``tp`` ways by a head-wise ``Shard`` TP plan (the HF engine's,
    :mod:`rlctl.engines.hf_tp`), or None. Every rank must hold whole query and KV heads (no KV-head
    replication: a ``Shard(0)`` cannot hold a head twice) and an equal share of the MLP."""
    if tp < 1:
        return f"tp={tp} must be >= 1"
    if spec.num_heads % tp:
        return f"num_attention_heads={spec.num_heads} is not divisible by tp={tp}"
    if spec.num_kv_heads % tp:
        return (
            f"num_key_value_heads={spec.num_kv_heads} is not divisible by tp={tp} (the HF engine shards "
            "whole KV heads; it cannot replicate them as vLLM does)"
        )
    if spec.intermediate_size % tp:
        return f"intermediate_size={spec.intermediate_size} is not divisible by tp={tp}"
    return None


ROLLOUT_FORMATS = ("vllm", "hf", "hf_tp")


def rollout_layout(
    spec: ModelSpec, tp: int, world: int | None = None, *, rank_order: str = "contiguous", fmt: str = "vllm"
) -> Layout:
    """Rollout layout over ``world`` ranks (default ``tp``): ``world // tp`` replicas of a TP set.

    ``fmt="vllm"``: vLLM's per-rank parameters (merged ``qkv_proj`` / ``gate_up_proj``, vocab padded
    to a multiple of 64 then split evenly, padding rows zero, tied LM head absent as vLLM skips it).
    ``fmt="hf"``: unmerged full HF names (the HF rollout engine at TP 1).
    ``fmt="hf_tp"``: the HF engine's TP shards (:mod:`rlctl.engines.hf_tp`): HF names, DTensor
    ``Shard`` pieces (``torch.chunk`` split) - q/k/v and gate/up by rows, o/down by columns, embedding
    and untied LM head by vocabulary rows, norms and row-parallel biases whole; tied LM head absent.
    """
    world = world or tp
    if fmt not in ROLLOUT_FORMATS:
        raise UserError(f"reshard: rollout format {fmt!r}; expected one of {', '.join(ROLLOUT_FORMATS)}")
    if fmt == "hf" and tp != 1:
        raise UserError(f"reshard: rollout format 'hf' holds full HF tensors; needs tp=1, got tp={tp}")
    if world % tp:
        raise UserError(f"reshard: world size {world} is not a multiple of rollout tp={tp}")
    why = check_hf_tp(spec, tp) if fmt == "hf_tp" else check_tp(spec, tp)
    if why:
        raise UserError(f"reshard: rollout tp={tp} not possible for this model: {why}")
    if fmt == "hf":
        params = spec.hf_params()
        hf = tuple(LocalTensor(n, s, (_full(n, s),)) for n, s in params.items())
        return Layout("hf(tp=1)", tuple(hf for _ in range(world)))
    if fmt == "hf_tp":
        per_tp = [tuple(_tp_rank_tensors(spec, tp, t, False, 0)) for t in range(tp)]
        ranks = tuple(per_tp[tp_rank_of(r, world, tp, rank_order)] for r in range(world))
        return Layout(f"hf_tp(tp={tp},{rank_order})", ranks)
    per_tp = [tuple(_tp_rank_tensors(spec, tp, t, True, VLLM_VOCAB_PADDING)) for t in range(tp)]
    ranks = tuple(per_tp[tp_rank_of(r, world, tp, rank_order)] for r in range(world))
    return Layout(f"vllm(tp={tp},{rank_order})", ranks)


def megatron_layout(spec: ModelSpec, tp: int, world: int | None = None) -> Layout:
    """Megatron-style TP (contiguous TP groups, ``world // tp`` data-parallel replicas).

    Column-parallel q/k/v (head-aware, kv replicated when tp > kv heads) and gate/up, row-parallel
    o_proj/down_proj, vocab-parallel embedding/LM head padded to a multiple of ``128 * tp``
    (``make_vocab_size_divisible_by``), replicated norms. Names stay HF's (unmerged).
    """
    world = world or tp
    if world % tp:
        raise UserError(f"reshard: world size {world} is not a multiple of megatron tp={tp}")
    multiple = MEGATRON_VOCAB_DIVISOR * tp
    why = check_tp(spec, tp, multiple)
    if why:
        raise UserError(f"reshard: megatron tp={tp} not possible for this model: {why}")
    per_tp = [tuple(_tp_rank_tensors(spec, tp, t, False, multiple)) for t in range(tp)]
    return Layout(f"megatron(tp={tp})", tuple(per_tp[r % tp] for r in range(world)))
