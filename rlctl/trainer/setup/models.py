"""Model paths of a profile: local HF directories, or ``builtin:NAME`` tiny models built on demand."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlctl.errors import UserError

BUILTIN = "builtin:"


def load_tokenizer(path: str, trust_remote_code: bool = False, where: str = "model.path") -> Any:
    """The tokenizer saved in a local model directory (never a hub lookup); ``where`` names the key."""
    if not Path(path).is_dir():
        raise UserError(f"{where}: not a local model directory: {path}")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)


def materialize_model(path: str, cache_dir: Path, seed: int = 0) -> str:
    """A local directory for ``path``; ``builtin:tiny-1m`` is built (once) under ``cache_dir``."""
    if not path.startswith(BUILTIN):
        if not (Path(path) / "config.json").is_file():
            raise UserError(
                f"model.path: not a local HF model directory (no config.json): {path}; a GGUF "
                "checkpoint becomes one with `rlctl model import FILE.gguf|smollm2-135m-instruct --out DIR`"
            )
        return path
    from rlctl.models import TINY_MODELS, build_tiny_model
    from rlctl.models.tiny import TINY_INIT

    name = path[len(BUILTIN) :]
    if name not in TINY_MODELS:
        raise UserError(
            f"model.path: unknown built-in model {name!r}; expected one of {', '.join(TINY_MODELS)}"
        )
    out = cache_dir / f"{name}-{TINY_INIT}-seed{seed}"  # a build by an older initialiser is not reused
    if not (out / "config.json").is_file():
        build_tiny_model(name, out, seed=seed)
    return str(out)


def stop_token_ids(model_dir: str, tokenizer: Any) -> list[int]:
    """Every token that ends a response: the tokenizer's EOS plus ``generation_config.eos_token_id``.

    Chat models often end a turn on a token other than the tokenizer's EOS (Llama 3:
    ``<|eot_id|>`` next to ``<|end_of_text|>``; Qwen2.5: ``<|im_end|>`` and ``<|endoftext|>``), and
    list all of them only in ``generation_config.json``.
    """
    ids: list[int] = []
    if tokenizer.eos_token_id is not None:
        ids.append(int(tokenizer.eos_token_id))
    if (Path(model_dir) / "generation_config.json").is_file():
        from transformers import GenerationConfig

        eos = GenerationConfig.from_pretrained(model_dir).eos_token_id
        ids += [int(t) for t in (eos if isinstance(eos, (list, tuple)) else [eos]) if t is not None]
    return list(dict.fromkeys(ids))
