"""Exact checks of a reshard's output: what each rollout rank must hold, and a digest of every tensor.

The expected tensors are built here from full HF tensors by an independent reading of vLLM's weight
loaders (not from :mod:`rlctl.reshard.layout`), so a layout bug shows up as a mismatch instead of
being reproduced by the check. Written from vLLM's ``QKVParallelLinear`` / ``MergedColumnParallelLinear``
/ ``RowParallelLinear`` ``weight_loader`` (vllm/model_executor/layers/linear.py),
``VocabParallelEmbedding`` / ``ParallelLMHead`` (vocab_parallel_embedding.py) and
``LlamaForCausalLM.load_weights`` (models/llama.py; Qwen2 is the same), vLLM 0.10-0.11:

* q/k/v -> ``qkv_proj``: ``num_heads = heads / tp``; if ``tp >= kv``: one kv head per rank,
  ``replicas = tp / kv``, else ``kv / tp`` heads and no replicas. "q" narrows ``tp_rank * size``,
  "k"/"v" narrow ``(tp_rank // replicas) * size``; placed at 0, ``q``, ``q + kv`` rows. Same for bias.
* gate/up -> ``gate_up_proj``: shard i narrows ``tp_rank * I/tp``, placed at ``i * I/tp``.
* o_proj / down_proj weights narrow dim 1 at ``tp_rank * in/tp``; their biases are full.
* embed_tokens / lm_head: vocab padded to a multiple of 64, ``per = padded / tp`` rows per rank,
  rows ``[min(r*per, V), min((r+1)*per, V))`` loaded at the top, the rest zero.
* tied embeddings: ``lm_head.weight`` is skipped.

Values are :func:`fill`: a hash of (parameter, position) per element, so a value moved to another
position or taken from another tensor changes the tensor's digest.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

import torch

from rlctl.errors import RunError
from rlctl.rank_order import tp_rank_of

_MASK = 0x3FFF  # 14 low bits (+ sign below): the top exponent bit of bf16/fp16 stays clear -> finite


def _table(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-(1 << 15), 1 << 15, (n,), generator=g, dtype=torch.int32).bitwise_and_(
        _MASK | -(1 << 15)
    )


def fill(
    shape: tuple[int, ...], row0: int, param_index: int, dtype: torch.dtype, full_rows: int | None = None
) -> torch.Tensor:
    """Rows ``row0 .. row0 + shape[0]`` of parameter ``param_index`` (``full_rows`` rows in all,
    default ``row0 + shape[0]``): element (r, c) is ``row_table[r] ^ col_table[c]``, two random
    tables per parameter, so moving a value to another row, column or tensor changes it. For
    16-bit dtypes the bits are the value (always finite); other dtypes get ``(bits % 4093)``.
    One broadcast XOR per tensor: fast enough to fill a 7B-shaped layer stack in seconds."""
    rows = shape[0] if shape else 1
    cols = 1
    for d in shape[1:]:
        cols *= d
    full_rows = full_rows if full_rows is not None else row0 + rows
    row_t = _table(max(full_rows, 1), 2 * param_index + 1)[row0 : row0 + rows]
    col_t = _table(cols, 2 * param_index + 2)
    if torch.empty((), dtype=dtype).element_size() == 2:
        out = row_t.to(torch.int16)[:, None] ^ col_t.to(torch.int16)[None, :]
        return out.view(dtype).reshape(shape)
    out = (row_t[:, None] ^ col_t[None, :]).remainder_(4093)
    return out.to(dtype).reshape(shape)


def full_state(params: Mapping[str, tuple[int, ...]], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Every full HF tensor as :func:`fill` makes it (``params`` in ``ModelSpec.hf_params`` order)."""
    return {name: fill(shape, 0, i, dtype) for i, (name, shape) in enumerate(params.items())}


def _pad(v: int, to: int = 64) -> int:
    return ((v + to - 1) // to) * to


def vllm_shard(
    full: Mapping[str, torch.Tensor], cfg: Mapping, tp_rank: int, tp_size: int
) -> dict[str, torch.Tensor]:
    """The tensors vLLM's TP rank ``tp_rank`` of ``tp_size`` loads from full HF tensors (see module doc)."""
    heads, kv = cfg["num_attention_heads"], cfg.get("num_key_value_heads") or cfg["num_attention_heads"]
    hd = cfg.get("head_dim") or cfg["hidden_size"] // heads
    num_heads = heads // tp_size
    num_kv, replicas = (1, tp_size // kv) if tp_size >= kv else (kv // tp_size, 1)
    out: dict[str, torch.Tensor] = {}
    for name, w in full.items():
        if name == "lm_head.weight" and cfg.get("tie_word_embeddings"):
            continue
        if name in ("model.embed_tokens.weight", "lm_head.weight"):
            vocab = w.shape[0]
            per = _pad(vocab) // tp_size
            start, end = min(tp_rank * per, vocab), min((tp_rank + 1) * per, vocab)
            param = torch.zeros((per, w.shape[1]), dtype=w.dtype)
            param[: end - start].copy_(w.narrow(0, start, end - start))
            out[name] = param
            continue
        for proj, shard_id in ((".q_proj.", "q"), (".k_proj.", "k"), (".v_proj.", "v")):
            if proj in name:
                target = name.replace(proj, ".qkv_proj.")
                if target not in out:
                    out[target] = torch.empty(((num_heads + 2 * num_kv) * hd, *w.shape[1:]), dtype=w.dtype)
                if shard_id == "q":
                    offset, size, shard_rank = 0, num_heads * hd, tp_rank
                elif shard_id == "k":
                    offset, size, shard_rank = num_heads * hd, num_kv * hd, tp_rank // replicas
                else:
                    offset, size, shard_rank = (num_heads + num_kv) * hd, num_kv * hd, tp_rank // replicas
                out[target].narrow(0, offset, size).copy_(w.narrow(0, shard_rank * size, size))
                break
        else:
            for proj, idx in ((".gate_proj.", 0), (".up_proj.", 1)):
                if proj in name:
                    target = name.replace(proj, ".gate_up_proj.")
                    size = w.shape[0] // tp_size
                    if target not in out:
                        out[target] = torch.empty((2 * size, *w.shape[1:]), dtype=w.dtype)
                    out[target].narrow(0, idx * size, size).copy_(w.narrow(0, tp_rank * size, size))
                    break
            else:
                if (".o_proj." in name or ".down_proj." in name) and name.endswith(".weight"):
                    size = w.shape[1] // tp_size
                    out[name] = w.narrow(1, tp_rank * size, size)
                else:  # norms, row-parallel biases: replicated
                    out[name] = w
    return out


def digest(t: torch.Tensor) -> str:
    """SHA-256 of dtype, shape and every byte of ``t`` (row-major), as hex."""
    h = hashlib.sha256(f"{t.dtype}{tuple(t.shape)}".encode())
    flat = t.detach().to("cpu").contiguous().reshape(-1)
    if flat.numel():
        h.update(memoryview(flat.view(torch.uint8).numpy()))
    return h.hexdigest()


def digests(tensors: Mapping[str, torch.Tensor]) -> dict[str, str]:
    return {name: digest(t) for name, t in tensors.items()}


ROW_PARALLEL = (".o_proj.weight", ".down_proj.weight")  # split by input columns; their biases whole
COLUMN_PARALLEL = (".q_proj.", ".k_proj.", ".v_proj.", ".gate_proj.", ".up_proj.")


def hf_tp_shard(
    full: Mapping[str, torch.Tensor], cfg: Mapping, tp_rank: int, tp_size: int
) -> dict[str, torch.Tensor]:
    """The tensors TP rank ``tp_rank`` of the HF engine's tensor-parallel model holds
    (:mod:`rlctl.engines.hf_tp`), cut from full HF tensors with ``torch.chunk``: q/k/v, gate/up,
    embedding and LM head by rows, o/down by columns, the rest whole; a tied LM head absent."""
    out: dict[str, torch.Tensor] = {}
    for name, w in full.items():
        if name == "lm_head.weight" and cfg.get("tie_word_embeddings"):
            continue
        rows = name in ("model.embed_tokens.weight", "lm_head.weight") or any(
            p in name for p in COLUMN_PARALLEL
        )
        if rows:
            out[name] = torch.chunk(w, tp_size, dim=0)[tp_rank].clone()
        elif name.endswith(ROW_PARALLEL):
            out[name] = torch.chunk(w, tp_size, dim=1)[tp_rank].clone()
        else:
            out[name] = w
    return out


def expected_digests(
    cfg: Mapping, full: Mapping[str, torch.Tensor], world: int, tp: int, rank_order: str, fmt: str
) -> list[dict[str, str]]:
    """Per rank, the digest of every tensor the rollout engine would load (``fmt`` "vllm", "hf" or
    "hf_tp")."""
    if fmt == "hf":
        ref = digests(full)
        return [ref for _ in range(world)]
    shard = hf_tp_shard if fmt == "hf_tp" else vllm_shard
    per_tp = [digests(shard(full, cfg, t, tp)) for t in range(tp)]
    return [per_tp[tp_rank_of(r, world, tp, rank_order)] for r in range(world)]


def mismatches(got: Sequence[Mapping[str, str]], want: Sequence[Mapping[str, str]]) -> list[str]:
    """``"rank R: tensor"`` for every tensor missing, extra or different; empty when all equal."""
    bad = []
    for rank, (g, w) in enumerate(zip(got, want, strict=True)):
        for name in sorted(set(g) | set(w)):
            if name not in g:
                bad.append(f"rank {rank}: {name} missing")
            elif name not in w:
                bad.append(f"rank {rank}: {name} not expected")
            elif g[name] != w[name]:
                bad.append(f"rank {rank}: {name}")
    return bad


def check(what: str, got: Sequence[Mapping[str, str]], want: Sequence[Mapping[str, str]]) -> None:
    """RunError naming ``what`` and the first tensors that differ from what the rollout must load."""
    bad = mismatches(got, want)
    if bad:
        shown = "; ".join(bad[:5]) + (f"; and {len(bad) - 5} more" if len(bad) > 5 else "")
        raise RunError(
            f"reshard check failed for {what}: {len(bad)} tensor(s) differ from the rollout's: {shown}"
        )
