"""What each tensor-parallel rank of vLLM or SGLang holds of every HF tensor, and where.

Written from the weight loaders (paths inside the wheels): vLLM 0.13.0 and 0.33.0 (0.10.2 the same)
``vllm/model_executor/layers/linear.py`` (``QKVParallelLinear.weight_loader``: query rows
``tp_rank * heads/q``, key/value rows of KV head group ``tp_rank // num_kv_head_replicas``, where
``num_kv_head_replicas = q // num_kv_heads`` when ``q >= num_kv_heads``, else 1;
``MergedColumnParallelLinear``: gate then up, each ``intermediate/q`` rows of ``tp_rank``;
``RowParallelLinear``: input columns ``tp_rank * in/q``, bias whole) and
``vocab_parallel_embedding.py`` (``VocabParallelEmbedding`` / ``ParallelLMHead``: the vocabulary padded
to a multiple of ``DEFAULT_VOCAB_PADDING_SIZE = 64``, split evenly, padding rows ``fill_(0)``; a tied
LM head is the embedding). SGLang 0.5.3 and 0.5.23 ``sglang/srt/layers/linear.py`` and
``vocab_parallel_embedding.py`` fork the same arithmetic (0.5.23 names the KV split ``kv_tp_size``,
the TP size without DP attention). The model classes merge q/k/v into ``qkv_proj`` and gate/up into
``gate_up_proj`` (``packed_modules_mapping``, ``models/qwen2.py`` and ``llama.py``).

Used for the fingerprint under TP (each rank reads the HF rows it holds; a KV head replicated on
several ranks counts once, from the first) and for the plan's per-rank sizes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from rlctl.engines.hf_tp import Split

VOCAB_PADDING = 64
MERGED = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj",
          "gate_proj": "gate_up_proj", "up_proj": "gate_up_proj"}  # fmt: skip
ROW_PARALLEL = ("o_proj", "down_proj")
VOCAB = ("embed_tokens", "lm_head")


@dataclass(frozen=True)
class Heads:
    """A model's attention and MLP sizes as the loaders divide them."""

    num_heads: int
    num_kv_heads: int
    intermediate: int
    vocab: int

    @classmethod
    def of(cls, config: Any) -> Heads:
        get = config.get if isinstance(config, Mapping) else lambda k, d=None: getattr(config, k, d)
        heads = int(get("num_attention_heads"))
        return cls(heads, int(get("num_key_value_heads", None) or heads), int(get("intermediate_size")),
                   int(get("vocab_size")))  # fmt: skip


def kv_split(num_kv_heads: int, tp: int) -> tuple[int, int]:
    """(KV heads per rank, ranks holding each KV head): ``QKVParallelLinear.__init__``."""
    if tp >= num_kv_heads:
        return 1, tp // num_kv_heads
    return num_kv_heads // tp, 1


def padded_vocab(vocab: int) -> int:
    """``pad_vocab_size(vocab, 64)``."""
    return -(-vocab // VOCAB_PADDING) * VOCAB_PADDING


def why_not(heads: Heads, tp: int) -> str | None:
    """Why vLLM/SGLang cannot split the model ``tp`` ways (``divide`` asserts in their layers), or None."""
    if tp < 1:
        return f"{tp} must be >= 1"
    if heads.num_heads % tp:
        return f"{tp} does not divide the model's num_attention_heads ({heads.num_heads})"
    kv = heads.num_kv_heads
    if (tp >= kv and tp % kv) or (tp < kv and kv % tp):
        return f"{tp} and the model's num_key_value_heads ({kv}): one must divide the other"
    if heads.intermediate % tp:
        return f"{tp} does not divide the model's intermediate_size ({heads.intermediate})"
    if padded_vocab(heads.vocab) % tp:
        return f"{tp} does not divide the padded vocabulary ({padded_vocab(heads.vocab)})"
    return None


@dataclass(frozen=True)
class Piece:
    """HF tensor ``hf`` as TP rank ``t`` holds it: rows ``[first, first + rows)`` of the engine's
    ``param`` (all of it for a row-parallel weight), split as ``split`` (None: held whole).
    ``rows == 0`` with a split: a replicated KV head whose first holder reports it."""

    hf: str
    param: str
    first: int
    rows: int
    split: Split | None


def piece(name: str, shape: Sequence[int], heads: Heads, tp: int, t: int) -> Piece:
    """Where TP rank ``t`` of ``tp`` holds HF tensor ``name`` of ``shape`` (Llama/Qwen2 naming)."""
    shape = tuple(int(d) for d in shape)
    path, _, leaf = name.rpartition(".")
    prefix, _, sub = path.rpartition(".")
    whole = Piece(name, name, 0, shape[0] if shape else 0, None)
    if tp == 1:
        return whole
    if sub in MERGED:
        fused = f"{prefix}.{MERGED[sub]}.{leaf}"
        if sub in ("gate_proj", "up_proj"):
            rows = shape[0] // tp
            return Piece(name, fused, 0 if sub == "gate_proj" else rows, rows, Split(0, t * rows, shape))
        if sub == "q_proj":
            rows = shape[0] // tp
            return Piece(name, fused, 0, rows, Split(0, t * rows, shape))
        head_dim = shape[0] // heads.num_kv_heads
        per, replicas = kv_split(heads.num_kv_heads, tp)
        rows = per * head_dim
        q_local = heads.num_heads // tp * head_dim  # q/k/v share head_dim in these families
        first = q_local + (0 if sub == "k_proj" else rows)
        counted = rows if t % replicas == 0 else 0
        return Piece(name, fused, first, counted, Split(0, (t // replicas) * rows, shape))
    if sub in ROW_PARALLEL and leaf == "weight":
        cols = shape[1] // tp
        return Piece(name, name, 0, shape[0], Split(1, t * cols, shape))
    if sub in VOCAB:
        per = padded_vocab(shape[0]) // tp
        start = min(t * per, shape[0])
        return Piece(name, name, 0, min(per, shape[0] - start), Split(0, start, shape))
    return whole


def views(
    spec: Sequence[tuple[str, Sequence[int]]], params: Mapping[str, torch.Tensor], heads: Heads, tp: int, t: int
) -> tuple[dict[str, torch.Tensor], dict[str, Split]]:
    """HF name -> the rows of the engine's parameter that hold it on this rank, and how it was
    split, for :func:`rlctl.engines.fingerprint.fingerprint_sharded`. A name the engine lacks is left
    out (its fingerprint is then None: "not available", never "ok")."""
    out: dict[str, torch.Tensor] = {}
    splits: dict[str, Split] = {}
    for name, shape in spec:
        p = piece(name, shape, heads, tp, t)
        param = params.get(p.param)
        if param is None:
            continue
        out[name] = param if p.split is not None and p.split.dim == 1 else param.narrow(0, p.first, p.rows)
        if p.split is not None:
            splits[name] = p.split
    return out, splits
