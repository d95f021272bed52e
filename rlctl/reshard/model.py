"""Model shape spec for HF Llama/Qwen2-family decoders, read from a config.

Only shapes matter to resharding: this module turns a ``transformers`` config (or a plain dict
with the same keys) into the full HF parameter list, in the order HF's ``named_parameters`` uses.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from rlctl.errors import UserError

_REQUIRED = (
    "hidden_size",
    "num_attention_heads",
    "intermediate_size",
    "vocab_size",
    "num_hidden_layers",
)


@dataclass(frozen=True)
class ModelSpec:
    """Dimensions of a Llama/Qwen2-family decoder that fix every parameter's shape."""

    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    num_layers: int
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    dtype: torch.dtype = torch.bfloat16

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def hf_params(self) -> dict[str, tuple[int, ...]]:
        """HF parameter names -> shapes, in ``named_parameters()`` order."""
        h, i = self.hidden_size, self.intermediate_size
        out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (self.vocab_size, h)}
        for n in range(self.num_layers):
            p = f"model.layers.{n}."
            out[p + "self_attn.q_proj.weight"] = (self.q_size, h)
            if self.qkv_bias:
                out[p + "self_attn.q_proj.bias"] = (self.q_size,)
            out[p + "self_attn.k_proj.weight"] = (self.kv_size, h)
            if self.qkv_bias:
                out[p + "self_attn.k_proj.bias"] = (self.kv_size,)
            out[p + "self_attn.v_proj.weight"] = (self.kv_size, h)
            if self.qkv_bias:
                out[p + "self_attn.v_proj.bias"] = (self.kv_size,)
            out[p + "self_attn.o_proj.weight"] = (h, self.q_size)
            if self.o_bias:
                out[p + "self_attn.o_proj.bias"] = (h,)
            out[p + "mlp.gate_proj.weight"] = (i, h)
            if self.mlp_bias:
                out[p + "mlp.gate_proj.bias"] = (i,)
            out[p + "mlp.up_proj.weight"] = (i, h)
            if self.mlp_bias:
                out[p + "mlp.up_proj.bias"] = (i,)
            out[p + "mlp.down_proj.weight"] = (h, i)
            if self.mlp_bias:
                out[p + "mlp.down_proj.bias"] = (h,)
            out[p + "input_layernorm.weight"] = (h,)
            out[p + "post_attention_layernorm.weight"] = (h,)
        out["model.norm.weight"] = (h,)
        if not self.tie_word_embeddings:
            out["lm_head.weight"] = (self.vocab_size, h)
        return out

    def num_params(self) -> int:
        total = 0
        for shape in self.hf_params().values():
            n = 1
            for d in shape:
                n *= d
            total += n
        return total

    def nbytes(self) -> int:
        return self.num_params() * torch.empty((), dtype=self.dtype).element_size()


def _get(cfg: Any, key: str, default: Any = None) -> Any:
    if isinstance(cfg, Mapping):
        return cfg.get(key, default)
    return getattr(cfg, key, default)


def spec_from_config(config: Any, dtype: torch.dtype = torch.bfloat16) -> ModelSpec:
    """Build a :class:`ModelSpec` from a ``PretrainedConfig`` or a plain dict with the same keys.

    Qwen2 (``model_type == "qwen2"``) always has q/k/v biases and no o_proj bias; Llama uses
    ``attention_bias`` for q/k/v/o and ``mlp_bias`` for the MLP, as ``transformers`` does.
    """
    missing = [k for k in _REQUIRED if _get(config, k) is None]
    if missing:
        raise UserError(f"model config: missing keys {missing}; expected a Llama/Qwen2-family config")
    heads = int(_get(config, "num_attention_heads"))
    kv = int(_get(config, "num_key_value_heads") or heads)
    hidden = int(_get(config, "hidden_size"))
    head_dim = _get(config, "head_dim") or hidden // heads
    if heads % kv:
        raise UserError(
            f"model config: num_attention_heads={heads} is not a multiple of num_key_value_heads={kv}"
        )
    qwen2 = _get(config, "model_type") == "qwen2"
    attn_bias = bool(_get(config, "attention_bias", False))
    explicit_qkv = _get(config, "qkv_bias")
    qkv_bias = bool(explicit_qkv) if explicit_qkv is not None else (qwen2 or attn_bias)
    return ModelSpec(
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=kv,
        head_dim=int(head_dim),
        intermediate_size=int(_get(config, "intermediate_size")),
        vocab_size=int(_get(config, "vocab_size")),
        num_layers=int(_get(config, "num_hidden_layers")),
        tie_word_embeddings=bool(_get(config, "tie_word_embeddings", False)),
        qkv_bias=qkv_bias,
        o_bias=attn_bias and not qwen2,
        mlp_bias=bool(_get(config, "mlp_bias", False)) and not qwen2,
        dtype=dtype,
    )


def random_state_dict(spec: ModelSpec, seed: int = 0) -> dict[str, torch.Tensor]:
    """Full HF state dict with random values (benchmarks and tests build models from configs)."""
    gen = torch.Generator().manual_seed(seed)
    return {
        name: torch.randn(shape, generator=gen, dtype=torch.float32).to(spec.dtype)
        for name, shape in spec.hf_params().items()
    }
