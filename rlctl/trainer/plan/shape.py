"""The model's shape as a plan needs it: layers, widths, heads, vocabulary, parameter count.

Read from the profile's model directory (``config.json``), from the built-in tiny models, or, for
a model not on this machine (planning a cluster from a laptop), from :data:`KNOWN_CONFIGS` by the
directory's name. Multimodal configs nest the language model under ``text_config``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rlctl.errors import UserError

BUILTIN = "builtin:"

# The published config.json numbers of a few models profiles name by path, for planning where the
# weights are not downloaded. Each is the model's config.json on the Hugging Face hub.
KNOWN_CONFIGS: dict[str, dict[str, Any]] = {
    # huggingface.co/Qwen/Qwen2.5-7B-Instruct/blob/main/config.json
    "qwen2.5-7b-instruct": {
        "model_type": "qwen2",
        "vocab_size": 152064,
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": False,
    },
    # huggingface.co/Qwen/Qwen2.5-72B-Instruct/blob/main/config.json
    "qwen2.5-72b-instruct": {
        "model_type": "qwen2",
        "vocab_size": 152064,
        "hidden_size": 8192,
        "intermediate_size": 29568,
        "num_hidden_layers": 80,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": False,
    },
    # huggingface.co/meta-llama/Llama-3.1-8B-Instruct/blob/main/config.json
    "llama-3.1-8b-instruct": {
        "model_type": "llama",
        "vocab_size": 128256,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "max_position_embeddings": 131072,
        "tie_word_embeddings": False,
    },
    # huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct/blob/main/config.json
    "smollm2-135m-instruct": {
        "model_type": "llama",
        "vocab_size": 49152,
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": True,
    },
}
KNOWN_CONFIGS["llama-3.1-8b"] = KNOWN_CONFIGS["llama-3.1-8b-instruct"]
KNOWN_CONFIGS["qwen2.5-7b"] = KNOWN_CONFIGS["qwen2.5-7b-instruct"]

# model types whose attention q/k/v projections carry a bias (Qwen2's modeling code)
QKV_BIAS = {"qwen2"}


@dataclass(frozen=True)
class ModelShape:
    """What memory and divisibility depend on."""

    source: str  # where the numbers came from
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool = False

    @property
    def layer_params(self) -> int:
        """Parameters of one decoder layer (attention, gated MLP, two norms)."""
        h, q, kv = self.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        attn = h * q + 2 * h * kv + q * h
        if self.qkv_bias:
            attn += q + 2 * kv
        return attn + 3 * h * self.intermediate_size + 2 * h

    def lora_params(self, rank: int, target_modules: list[str], modules_to_save: list[str] = ()) -> int:
        """Trainable parameters of a peft LoRA adapter on this (Llama/Qwen2-shaped) model: ``rank``
        x (in + out) per adapted projection (``all-linear``: every projection but the output head),
        plus full copies of ``modules_to_save`` (peft trains those in full)."""
        h, i = self.hidden_size, self.intermediate_size
        q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        sides = {
            "q_proj": h + q, "k_proj": h + kv, "v_proj": h + kv, "o_proj": q + h,
            "gate_proj": h + i, "up_proj": h + i, "down_proj": i + h,
        }  # fmt: skip
        names = list(sides) if list(target_modules) == ["all-linear"] else list(target_modules)
        adapted = sum(sides.get(n.rsplit(".", 1)[-1], 0) for n in names)
        full = {"embed_tokens": self.vocab_size * h, "lm_head": self.vocab_size * h}
        return rank * adapted * self.num_layers + sum(full.get(m, 0) for m in modules_to_save)

    @property
    def params(self) -> int:
        """All parameters: embeddings, layers, final norm, and the LM head unless tied."""
        embed = self.vocab_size * self.hidden_size
        head = 0 if self.tie_word_embeddings else embed
        return embed + head + self.num_layers * self.layer_params + self.hidden_size

    def params_per_rank(self, tp: int, engine: str = "hf") -> int:
        """Rollout parameters one tensor-parallel rank holds. vLLM / SGLang (their loaders,
        :mod:`rlctl.engines.tp_shards`): q, MLP and o/down split ``tp`` ways, each rank at least one
        KV head (replicated when ``tp`` exceeds them), the vocabulary padded to 64 then split, norms
        whole. The HF engine: whole heads and ``torch.chunk`` pieces, about ``params / tp``."""
        if tp == 1 or engine not in ("vllm", "sglang"):
            return -(-self.params // tp)
        h, hd = self.hidden_size, self.head_dim
        kv_heads = max(1, self.num_kv_heads // tp)
        q, kv = self.num_heads * hd // tp, kv_heads * hd
        attn = 2 * h * q + 2 * h * kv + ((q + 2 * kv) if self.qkv_bias else 0)
        layer = attn + 3 * h * (self.intermediate_size // tp) + 2 * h
        vocab = -(-self.vocab_size // 64) * 64 // tp * h
        return vocab * (1 if self.tie_word_embeddings else 2) + self.num_layers * layer + h

    def kv_bytes_per_token(self, dtype_bytes: int, tp: int = 1) -> int:
        """K and V of one token over every layer on one tensor-parallel rank (kv heads are split
        over tp, or replicated when tp exceeds them, as vLLM does)."""
        kv_heads = max(1, self.num_kv_heads // tp) if tp <= self.num_kv_heads else 1
        return 2 * self.num_layers * kv_heads * self.head_dim * dtype_bytes

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "params": self.params}


def shape_from_config(cfg: dict[str, Any], source: str) -> ModelShape:
    """A ModelShape from config.json's numbers; a missing key is a UserError naming it."""
    cfg = cfg.get("text_config") or cfg
    try:
        heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        return ModelShape(
            source=source,
            model_type=str(cfg.get("model_type", "")),
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(cfg["intermediate_size"]),
            num_layers=int(cfg["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or hidden // heads),
            max_position_embeddings=int(cfg.get("max_position_embeddings") or 0),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=str(cfg.get("model_type", "")) in QKV_BIAS or bool(cfg.get("attention_bias")),
        )
    except KeyError as exc:
        raise UserError(f"{source}: config has no {exc.args[0]}; cannot plan this model") from None
    except (TypeError, ValueError) as exc:
        raise UserError(f"{source}: unreadable model config ({exc})") from None


def _builtin_shape(name: str, where: str) -> ModelShape:
    from rlctl.models import TINY_MODELS
    from rlctl.models.tokenizer import char_vocab

    if name not in TINY_MODELS:
        raise UserError(f"{where}: unknown built-in model {name!r}; expected one of {', '.join(TINY_MODELS)}")
    spec = TINY_MODELS[name]
    cfg = {
        "model_type": "qwen2",
        "vocab_size": len(char_vocab()),
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_hidden_layers,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_key_value_heads,
        "max_position_embeddings": spec.max_position_embeddings,
        "tie_word_embeddings": True,
    }
    return shape_from_config(cfg, f"built-in {name}")


def model_config(model_path: str) -> dict | None:
    """The model's config.json as a dict, or the known model's of that name; None when neither."""
    config = Path(model_path) / "config.json"
    try:
        cfg = json.loads(config.read_text())
    except (OSError, ValueError):
        cfg = KNOWN_CONFIGS.get(Path(model_path.rstrip("/")).name.lower())
    return cfg if isinstance(cfg, dict) else None


def model_shape(model_path: str, where: str = "model.path") -> ModelShape:
    """The shape of ``model_path``: its config.json, a built-in tiny model, or a known model
    named by the directory's last component. Unreadable: a UserError naming the path and the
    known names."""
    if model_path.startswith(BUILTIN):
        return _builtin_shape(model_path[len(BUILTIN) :], where)
    config = Path(model_path) / "config.json"
    if config.is_file():
        try:
            cfg = json.loads(config.read_text())
        except (OSError, ValueError) as exc:
            raise UserError(f"{config}: unreadable ({exc})") from None
        if not isinstance(cfg, dict):
            raise UserError(f"{config}: expected a JSON object")
        return shape_from_config(cfg, str(config))
    key = Path(model_path.rstrip("/")).name.lower()
    if key in KNOWN_CONFIGS:
        return shape_from_config(KNOWN_CONFIGS[key], f"known config of {key} (Hugging Face hub config.json)")
    raise UserError(
        f"{where}: {model_path} has no config.json here and is not a known model "
        f"({', '.join(sorted(KNOWN_CONFIGS))}); download the model's config.json into that directory"
    )
