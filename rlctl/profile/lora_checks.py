"""``[actor.lora]`` settings rlctl refuses before any work, each with its reason.

* ``dropout > 0``: the old log-probs run in eval mode (no dropout) and the update in train mode, so
  PPO's ratio and clipping would act on dropout noise (21% of tokens clipped on a first mini-batch
  where the ratio is exactly 1 without it), the zero-advantage skip stops being exact, and the
  workers' dropout RNG is not in the checkpoint, so a resumed run diverges.
* an embedding layer in ``target_modules``: the merged export and the merged-weights sync fold
  ``lora_A/B`` of linear layers only; peft's ``lora_embedding_A/B`` would be dropped.
* a tied input/output embedding in ``modules_to_save``: the trained copy of one half of the tie
  would be synced and exported as both (or peft fails building the wrapper).

The engine refuses the same at injection (:func:`rlctl.engines.lora.inject`), where the model's
own modules are known; here the names and ``config.json`` are enough to say so at profile check.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

# input-embedding module names of the transformers causal LMs (embed_tokens: Llama/Qwen/Mistral;
# wte: GPT-2; word_embeddings: BLOOM/Falcon; embed_in: GPT-NeoX; tok_embeddings: InternLM)
EMBEDDINGS = ("embed_tokens", "wte", "word_embeddings", "embed_in", "tok_embeddings")
OUTPUT_HEADS = ("lm_head", "embed_out", "output")


def tied_embeddings(model_path: str) -> bool:
    """Whether the model's config.json ties input and output embeddings (False when unreadable: the
    engine checks the loaded model)."""
    try:
        cfg = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(cfg, dict):
        return False
    cfg = cfg.get("text_config") or cfg
    return bool(cfg.get("tie_word_embeddings", False))


def _last(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def check_lora(lora: Any, model_path: str, fail: Callable[[str, str], None]) -> None:
    """``fail(key, message)`` for the first refused setting of ``[actor.lora]`` (module docstring)."""
    if lora.dropout > 0:
        fail(
            "actor.lora.dropout",
            f"{lora.dropout} is not supported; set 0: the old log-probs run without dropout and the "
            "update with it, so PPO's clipping would act on dropout noise, and its RNG is not "
            "checkpointed (a resumed run would diverge)",
        )
    for target in lora.target_modules:
        if _last(target) in EMBEDDINGS:
            fail(
                "actor.lora.target_modules",
                f"{target!r} is an embedding layer: its LoRA (lora_embedding_A/B) is not merged into "
                "the merged export or a merged-weights sync; train it in full with "
                "actor.lora.modules_to_save, or adapt the linear projections only",
            )
    if tied_embeddings(model_path):
        for saved in lora.modules_to_save:
            if _last(saved) in EMBEDDINGS + OUTPUT_HEADS:
                fail(
                    "actor.lora.modules_to_save",
                    f"{saved!r} is one half of the model's tied input/output embedding "
                    f"(tie_word_embeddings in {model_path}/config.json): a trained copy of one half "
                    "cannot be synced or exported as the tied pair; adapt the model without it",
                )
