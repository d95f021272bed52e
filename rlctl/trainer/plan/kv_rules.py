"""Each rollout engine's length key and its own start-up rule for the KV cache.

- vLLM (0.33.0): the key is ``max_model_len`` (``EngineArgs``); the engine refuses to start when
  the KV cache of one sequence at ``max_model_len`` (``cdiv(max_model_len, block_size)`` pages per
  layer, ``FullAttentionSpec.max_memory_usage_bytes``) exceeds what ``gpu_memory_utilization`` of
  the device leaves after weights and activations (``v1/core/kv_cache_planning.py``
  ``_check_enough_kv_cache_memory``).
- SGLang (0.5.23, same rule in 0.5.3): the key is ``context_length`` (``ServerArgs``; it has no
  ``max_model_len``). Start-up fails only when the KV pool holds no token ("Not enough memory",
  0.5.23 ``model_executor/pool_configurator.py`` ``MemoryPoolConfig``; 0.5.3
  ``model_executor/model_runner.py``); a pool smaller than ``context_length`` is a warning. With
  ``max_req_len = min(context_length - 1, pool tokens - 1)`` (``managers/tp_worker.py``
  ``get_worker_info``) the scheduler caps ``max_new_tokens`` at ``max_req_len - prompt - 1``
  (``managers/scheduler.py``): prompt + response <= ``min(context_length, pool) - 2``. A
  ``context_length`` above the model's own is a ValueError unless
  ``SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN`` is set (``configs/model_config.py``
  ``_derive_context_length``).
- The HF engine has no pool: the model's ``max_position_embeddings`` bounds a sequence.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

LENGTH_KEY = {"vllm": "max_model_len", "sglang": "context_length", "hf": "max_model_len"}


def engine_length(engine: str, engine_kwargs: Mapping[str, Any], model_max: int) -> tuple[int, str, str]:
    """``(length, key, where it came from)``: the engine's own length keyword in
    ``rollout.engine_kwargs`` when set, else the model's ``max_position_embeddings`` (both engines'
    default)."""
    key = LENGTH_KEY.get(engine, "max_model_len")
    if engine_kwargs.get(key):
        return int(engine_kwargs[key]), key, f"rollout.engine_kwargs.{key}"
    return model_max, key, "the model's max_position_embeddings (the engine's default)"


def kv_checks(
    engine: str,
    *,
    kv_budget: int,
    kv_per_token: int,
    kv_per_max_len_sequence: int,
    sequences_at_max_len: int | None,
    length: int,
    key: str,
    source: str,
    model_max: int,
    prompt_len: int,
    seq_len: int,
    gib,
) -> list[tuple[str, bool, str, str]]:
    """``(name, ok, detail, fix)`` of the engine's own length rule against its KV budget."""
    if engine == "sglang":
        pool = max(0, kv_budget) // kv_per_token if kv_per_token else 0
        served = min(length, pool) - 2  # max_req_len - 1: the scheduler's cap on prompt + response
        return [
            (
                "context_length within the model",
                length <= model_max,
                f"context_length {length} ({source}); the model's own is {model_max}",
                f"rollout.engine_kwargs context_length <= {model_max} (SGLang raises ValueError above "
                "the model's length unless SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1)",
            ),
            (
                "context_length KV fits",
                seq_len <= pool - 2,
                f"SGLang's KV pool holds {pool} tokens and serves prompt + response up to "
                f"min(context_length {length}, pool) - 2 = {served} tokens (a pool smaller than "
                f"context_length is only a warning); this run's longest is {seq_len}",
                f"raise rollout.gpu_memory_utilization, or shorten data.max_prompt_length / "
                f"rollout.max_new_tokens to fit {max(0, pool - 2)} tokens",
            ),
        ]
    return [
        (
            "max_model_len KV fits",
            kv_per_max_len_sequence <= max(0, kv_budget),
            f"one {length}-token sequence needs {gib(kv_per_max_len_sequence)} of KV "
            f"({source}); budget {gib(kv_budget)}, {sequences_at_max_len} such sequences fit",
            f"set rollout.engine_kwargs {key} = {seq_len} (data.max_prompt_length + "
            "rollout.max_new_tokens) or raise rollout.gpu_memory_utilization",
        )
    ]
