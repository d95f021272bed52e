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
            raise UserError(f"model.path: not a local HF model directory (no config.json): {path}")
        return path
    from rlctl.models import TINY_MODELS, build_tiny_model

    name = path[len(BUILTIN) :]
    if name not in TINY_MODELS:
        raise UserError(
            f"model.path: unknown built-in model {name!r}; expected one of {', '.join(TINY_MODELS)}"
        )
    out = cache_dir / f"{name}-seed{seed}"
    if not (out / "config.json").is_file():
        build_tiny_model(name, out, seed=seed)
    return str(out)
