"""Model paths of a profile: local HF directories, or ``builtin:NAME`` tiny models built on demand."""

from __future__ import annotations

from pathlib import Path

from rlctl.errors import UserError

BUILTIN = "builtin:"


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
