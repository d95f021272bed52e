"""Loading HF models from a local path, the critic's value-head wrapper and a version-proof forward.

transformers renamed ``past_key_values`` to ``cache`` (5.x); :func:`cache_kwarg` picks the name the
installed version takes so the engines run on 4.51 through 5.x.
"""

from __future__ import annotations

import inspect
from functools import lru_cache
from pathlib import Path

import torch
from torch import nn

from rlctl.errors import UserError
from rlctl.platforms.hub_kernels import no_hub_kernels

DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """``"bf16"``/``"bfloat16"``/torch dtype -> torch dtype; UserError names the bad value."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise UserError(f"dtype={dtype!r} is not supported; expected one of {sorted(DTYPES)}")
    return DTYPES[dtype]


def _check_path(model_path: str | Path) -> Path:
    """``model_path`` as a Path once it holds a config; also silences transformers' per-load
    progress bars, which every worker would otherwise print into the run's log."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    path = Path(model_path)
    if not (path / "config.json").is_file():
        raise UserError(f"model path {str(path)!r} has no config.json; expected a local HF model directory")
    return path


def load_causal_lm(
    model_path: str | Path,
    *,
    dtype: str | torch.dtype = "float32",
    trust_remote_code: bool = False,
    attn_implementation: str = "sdpa",
) -> nn.Module:
    """An ``AutoModelForCausalLM`` from a local directory, on CPU, in ``dtype``."""
    from transformers import AutoModelForCausalLM

    path = _check_path(model_path)
    return AutoModelForCausalLM.from_pretrained(
        str(path),
        dtype=resolve_dtype(dtype),
        trust_remote_code=trust_remote_code,
        attn_implementation=attn_implementation,
        **no_hub_kernels(),
    )


class ValueHeadModel(nn.Module):
    """A critic: the HF base model (no LM head) plus a scalar value head on every position.

    ``forward`` returns the per-position values (B, L) in fp32. The backbone keeps its HF
    parameter names under ``backbone.``; the head is ``value_head``. The head runs outside autocast
    in its own parameters' dtype (fp32 master weights under mixed precision; FSDP2 gives it an fp32
    policy of its own), so values are not rounded to bf16.
    """

    def __init__(self, backbone: nn.Module, hidden_size: int):
        super().__init__()
        self.backbone = backbone
        self.config = backbone.config
        self.value_head = new_value_head(hidden_size, next(backbone.parameters()).dtype)
        self._no_split_modules = getattr(backbone, "_no_split_modules", None) or []

    def forward(self, input_ids, attention_mask=None, position_ids=None, **kwargs) -> torch.Tensor:
        out = self.backbone(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
        )
        hidden = out.last_hidden_state
        with torch.autocast(hidden.device.type, enabled=False):
            values = self.value_head(hidden.to(self.value_head.weight.dtype))
        return values.squeeze(-1).float()


def new_value_head(hidden_size: int, dtype: torch.dtype) -> nn.Linear:
    """A freshly initialised value head (draws from torch's global RNG: seed it the same on every rank)."""
    head = nn.Linear(hidden_size, 1, bias=True)
    nn.init.normal_(head.weight, std=1.0 / (hidden_size + 1) ** 0.5)
    nn.init.zeros_(head.bias)
    return head.to(dtype)


def load_value_model(
    model_path: str | Path,
    *,
    dtype: str | torch.dtype = "float32",
    trust_remote_code: bool = False,
    attn_implementation: str = "sdpa",
) -> ValueHeadModel:
    """A :class:`ValueHeadModel` whose backbone is ``AutoModel`` loaded from a local directory."""
    from transformers import AutoModel

    path = _check_path(model_path)
    backbone = AutoModel.from_pretrained(
        str(path),
        dtype=resolve_dtype(dtype),
        trust_remote_code=trust_remote_code,
        attn_implementation=attn_implementation,
        **no_hub_kernels(),
    )
    model = ValueHeadModel(backbone, backbone.config.hidden_size)
    head = path / "value_head.pt"
    if head.is_file():
        model.value_head.load_state_dict(torch.load(head, map_location="cpu", weights_only=True))
    return model


@lru_cache(maxsize=32)
def _forward_params(cls: type) -> frozenset[str]:
    return frozenset(inspect.signature(cls.forward).parameters)


def cache_kwarg(model: nn.Module) -> str:
    """``"cache"`` on transformers 5.x, ``"past_key_values"`` before."""
    return "cache" if "cache" in _forward_params(type(model)) else "past_key_values"


def supports_logits_to_keep(model: nn.Module) -> bool:
    """Whether ``forward`` can skip the LM head on positions we do not need."""
    return "logits_to_keep" in _forward_params(type(model))


def output_cache(out) -> object:
    """The KV cache of a forward output, whatever the attribute is called."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else getattr(out, "past_key_values", None)
