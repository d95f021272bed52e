"""Load a user's reward function from ``path/to/file.py:name`` (verl's custom_reward_function).

The function has verl's signature ``compute_score(data_source, solution_str, ground_truth,
extra_info)`` and returns a float or a dict with at least ``"score"``. This is the only user code
a profile may run; it is imported from the file path given, never from an installed module.
"""

from __future__ import annotations

import importlib.util
import inspect
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlctl.errors import UserError


def parse_function_spec(spec: str) -> tuple[Path, str]:
    """``file.py:name`` -> (path, name); the name defaults to ``compute_score`` as in verl."""
    path, sep, name = spec.rpartition(":")
    if not sep or not path or "/" in name or name.endswith(".py"):
        path, name = spec, "compute_score"
    return Path(path), name


def load_custom_reward(spec: str, base_dir: str | Path | None = None) -> Callable[..., Any]:
    """The function named by ``spec``; relative paths resolve against ``base_dir`` (the profile's dir)."""
    path, name = parse_function_spec(spec)
    if not path.is_absolute() and base_dir is not None:
        path = Path(base_dir) / path
    if not path.is_file():
        raise UserError(f"reward function file not found: {path} (from {spec!r})")
    if path.suffix != ".py":
        raise UserError(f"reward function file must be a .py file, got {path}")
    module_name = f"rlctl_user_reward_{abs(hash(str(path.resolve())))}"
    loader_spec = importlib.util.spec_from_file_location(module_name, path)
    if loader_spec is None or loader_spec.loader is None:
        raise UserError(f"cannot import reward function file {path}")
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[module_name] = module  # so pickling / dataclasses inside the file work
    try:
        loader_spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(module_name, None)
        raise UserError(
            f"reward function file {path} failed to import: {type(exc).__name__}: {exc}"
        ) from None
    fn = getattr(module, name, None)
    if fn is None or not callable(fn):
        raise UserError(f"reward function {name!r} not found in {path} (expected a function named {name})")
    try:
        inspect.signature(fn).bind("src", "text", "truth", {})
    except TypeError:
        raise UserError(
            f"reward function {name} in {path} must accept "
            "(data_source, solution_str, ground_truth, extra_info)"
        ) from None
    return fn
