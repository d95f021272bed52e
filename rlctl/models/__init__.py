"""Built-in tiny model family (Qwen2 architecture) and its character-level tokenizer."""

from rlctl.models.tiny import (
    TINY_MODELS,
    build_tiny_model,
    build_tiny_reward_model,
    count_parameters,
    get_spec,
    tiny_config,
)
from rlctl.models.tokenizer import CHAT_TEMPLATE, build_char_tokenizer

__all__ = [
    "CHAT_TEMPLATE",
    "TINY_MODELS",
    "build_char_tokenizer",
    "build_tiny_model",
    "build_tiny_reward_model",
    "count_parameters",
    "get_spec",
    "tiny_config",
]
