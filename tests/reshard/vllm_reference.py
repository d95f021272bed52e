"""Independent reference: what vLLM's TP rank loads from full HF tensors (Llama/Qwen2).

Written from vLLM's loaders (vllm/model_executor/layers/linear.py, vocab_parallel_embedding.py and
models/llama.py ``load_weights``), not from rlctl's layouts:

* QKVParallelLinear: ``num_heads = total_heads / tp``; if ``tp >= total_kv``: ``num_kv_heads = 1``,
  ``num_kv_head_replicas = tp / total_kv`` else ``num_kv_heads = total_kv / tp``, replicas 1.
  Shard "q" narrows ``tp_rank * shard_size``; "k"/"v" narrow ``(tp_rank // replicas) * shard_size``;
  placed at offsets 0, ``num_heads*hd``, ``(num_heads+num_kv_heads)*hd`` of qkv_proj. Same for bias.
* MergedColumnParallelLinear (gate_up_proj): shard i narrows ``tp_rank * (I/tp)`` at ``i * I/tp``.
* RowParallelLinear (o_proj, down_proj): ``input_dim=1`` narrowed at ``tp_rank * in/tp``; bias full.
* VocabParallelEmbedding / ParallelLMHead: vocab padded to a multiple of 64, ``per = padded / tp``;
  rank loads rows ``[min(r*per, V), min((r+1)*per, V))`` into ``param[:n]``, zero-fills the rest.
* tie_word_embeddings: ``lm_head.*`` is skipped (shares embed_tokens).
"""

from __future__ import annotations

import torch


def _pad(v: int, to: int = 64) -> int:
    return ((v + to - 1) // to) * to


def vllm_shard(
    full: dict[str, torch.Tensor], cfg: dict, tp_rank: int, tp_size: int
) -> dict[str, torch.Tensor]:
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or cfg["hidden_size"] // heads
    num_heads = heads // tp_size
    if tp_size >= kv:
        num_kv, replicas = 1, tp_size // kv
    else:
        num_kv, replicas = kv // tp_size, 1
    out: dict[str, torch.Tensor] = {}
    for name, w in full.items():
        if name == "lm_head.weight" and cfg.get("tie_word_embeddings"):
            continue
        if name in ("model.embed_tokens.weight", "lm_head.weight"):
            vocab = w.shape[0]
            per = _pad(vocab) // tp_size
            start, end = min(tp_rank * per, vocab), min((tp_rank + 1) * per, vocab)
            param = torch.empty((per, w.shape[1]), dtype=w.dtype)
            loaded = w.narrow(0, start, end - start)
            param[: loaded.shape[0]].copy_(loaded)
            param[loaded.shape[0] :].fill_(0)
            out[name] = param
            continue
        for proj, shard_id in ((".q_proj.", "q"), (".k_proj.", "k"), (".v_proj.", "v")):
            if proj in name:
                target = name.replace(proj, ".qkv_proj.")
                if target not in out:
                    rows = (num_heads + 2 * num_kv) * hd
                    out[target] = torch.empty((rows, *w.shape[1:]), dtype=w.dtype)
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
                    out[name] = w.narrow(1, tp_rank * size, size).clone()
                else:  # norms, row-parallel biases: replicated
                    out[name] = w.clone()
    return out
