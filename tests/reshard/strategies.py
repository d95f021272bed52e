"""Hypothesis strategies: random Llama/Qwen2 configs with a (p, q) pair the model allows."""

from __future__ import annotations

import math

import torch
from hypothesis import strategies as st


@st.composite
def config_pq(draw: st.DrawFn, max_world: int = 8) -> tuple[dict, int, int]:
    """A config dict plus train world p and rollout tp q (1..8) such that vLLM can split it q ways."""
    q = draw(st.integers(1, max_world))
    kv = draw(st.sampled_from([d for d in range(1, 9) if q % d == 0 or d % q == 0]))
    heads = math.lcm(kv, q) * draw(st.integers(1, 2))
    head_dim = draw(st.sampled_from([2, 4, 6]))
    explicit_head_dim = draw(st.booleans())
    hidden = draw(st.integers(4, 24)) if explicit_head_dim else heads * head_dim
    step = q // math.gcd(q, 64)  # padded vocab / 64 must be a multiple of this
    n64 = step * draw(st.integers(1, max(1, 4 // step)))
    vocab = draw(st.integers(64 * (n64 - 1) + 1, 64 * n64))
    p = draw(st.sampled_from([x for x in range(1, max_world + 1) if x <= q or x % q == 0]))
    qwen2 = draw(st.booleans())
    cfg = {
        "model_type": "qwen2" if qwen2 else "llama",
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "head_dim": head_dim if explicit_head_dim else None,
        "intermediate_size": q * draw(st.integers(1, 5)),
        "vocab_size": vocab,
        "num_hidden_layers": draw(st.integers(1, 2)),
        "tie_word_embeddings": draw(st.booleans()),
        "attention_bias": (not qwen2) and draw(st.booleans()),
        "mlp_bias": (not qwen2) and draw(st.booleans()),
    }
    return cfg, p, q


def full_state(spec, seed: int) -> dict[str, torch.Tensor]:
    """Distinct values everywhere (arange), so any misplaced element shows up."""
    gen = torch.Generator().manual_seed(seed)
    out, base = {}, 0
    for name, shape in spec.hf_params().items():
        n = math.prod(shape)
        vals = (torch.arange(n, dtype=torch.float64) + base) % 4093 + torch.rand(
            n, generator=gen, dtype=torch.float64
        )
        out[name] = vals.reshape(shape).to(spec.dtype)
        base += n
    return out


def fsdp_shards_by_chunk(full: dict[str, torch.Tensor], p: int, world: int) -> list[dict[str, torch.Tensor]]:
    """Each rank's FSDP2 shard, computed directly with torch.chunk (empty trailing shards kept)."""
    ranks: list[dict[str, torch.Tensor]] = [{} for _ in range(world)]
    for name, t in full.items():
        chunks = list(torch.chunk(t, p, dim=0))
        for r in range(p):
            ranks[r][name] = chunks[r].clone() if r < len(chunks) else t.new_empty((0, *t.shape[1:]))
    return ranks
