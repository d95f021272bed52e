"""The built-in tiny model family: Qwen2-architecture configs with the character tokenizer.

``build_tiny_model`` writes an ordinary HF model directory (config.json, model.safetensors,
generation_config.json, tokenizer files), so everything downstream loads it with
``AutoModelForCausalLM.from_pretrained`` / ``AutoTokenizer.from_pretrained``, exactly as it would
load a real checkpoint. Weights are random and depend only on the seed and the parameter names:
:func:`seeded_init` draws them with numpy's PCG64 streams, not with the library's initialiser,
whose draws follow the installed transformers/torch (a new release would silently give a new
model, and a recipe that starts from it a different result).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from zlib import crc32

import numpy as np
import torch
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    GenerationConfig,
    Qwen2Config,
)

from rlctl.errors import UserError
from rlctl.models.tokenizer import build_char_tokenizer


@dataclass(frozen=True)
class TinySpec:
    """Shape of one tiny model; ``params`` is the nominal size it is named after."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    max_position_embeddings: int
    description: str


TINY_INIT = "pcg64"  # names the initialiser in cached builds; change it when seeded_init changes

TINY_MODELS: dict[str, TinySpec] = {
    "tiny-1m": TinySpec(128, 4, 4, 2, 512, 512, "~1.0M params; fast on 2 CPU cores (default task)"),
    "tiny-10m": TinySpec(256, 10, 8, 4, 1024, 1024, "~9.9M params; for harder built-in tasks"),
}


def tiny_config(name: str, vocab_size: int, pad_id: int, bos_id: int, eos_id: int) -> Qwen2Config:
    """The Qwen2Config of a named tiny model (tied embeddings, rope theta 10000, fp32)."""
    spec = get_spec(name)
    return Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        rope_parameters={"rope_theta": 10000.0, "rope_type": "default"},
        initializer_range=0.02,
        pad_token_id=pad_id,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        use_cache=True,
        architectures=["Qwen2ForCausalLM"],
    )


def get_spec(name: str) -> TinySpec:
    """The spec of a built-in tiny model, or a UserError listing the known names."""
    if name not in TINY_MODELS:
        raise UserError(f"unknown tiny model {name!r}; expected one of: {', '.join(sorted(TINY_MODELS))}")
    return TINY_MODELS[name]


def build_tiny_model(name: str, out_dir: str | Path, seed: int = 0) -> Path:
    """Write config, random weights (safetensors) and the tokenizer of ``name`` to ``out_dir``.

    Deterministic: the same name and seed give bit-identical weights.
    """
    get_spec(name)
    out = Path(out_dir)
    tokenizer = build_char_tokenizer(model_max_length=get_spec(name).max_position_embeddings)
    config = tiny_config(
        name, len(tokenizer), tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id
    )
    with torch.random.fork_rng(devices=[]):  # from_config's own init draws from the global RNG
        model = seeded_init(AutoModelForCausalLM.from_config(config, dtype=torch.float32), seed)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        do_sample=False,
    )
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


def build_tiny_reward_model(name: str, out_dir: str | Path, seed: int = 0) -> Path:
    """A tiny Qwen2 sequence-classification model (one score) with the character tokenizer.

    Random weights: a stand-in reward model for tests and for wiring a reward-model role locally.
    """
    spec = get_spec(name)
    out = Path(out_dir)
    tokenizer = build_char_tokenizer(model_max_length=spec.max_position_embeddings)
    config = tiny_config(
        name, len(tokenizer), tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id
    )
    config.num_labels = 1
    config.architectures = ["Qwen2ForSequenceClassification"]
    with torch.random.fork_rng(devices=[]):
        model = seeded_init(AutoModelForSequenceClassification.from_config(config, dtype=torch.float32), seed)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


def seeded_init(model: torch.nn.Module, seed: int, std: float = 0.02) -> torch.nn.Module:
    """Overwrite every parameter from ``seed`` alone: norm weights 1, biases 0, every other tensor
    N(0, ``std``) (the Qwen2 initializer_range) from its own PCG64 stream keyed by (seed, name).

    Keyed by name, a tensor's values do not depend on the order or number of the others; numpy's
    ``Generator.standard_normal`` stream is stable across numpy releases (NEP 19), and torch only
    stores the float32 values, so the same seed gives the same bytes on any installed stack.
    """
    with torch.no_grad():  # (the library's own init ran in from_config: its draws are all replaced)
        for name, param in model.named_parameters():  # tied weights appear once
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            elif name.endswith(".bias"):
                param.zero_()
            else:
                rng = np.random.default_rng([seed, crc32(name.encode())])
                values = rng.standard_normal(tuple(param.shape), dtype=np.float64) * std
                param.copy_(torch.from_numpy(values.astype(np.float32)))
    return model


def count_parameters(model: torch.nn.Module) -> int:
    """Unique parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in model.parameters())
