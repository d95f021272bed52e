"""Find a profile's environment: ``builtin:NAME`` or a user file ``path/to/file.py:Name``.

The file is imported from its path (never as an installed module), as custom reward functions
are (:mod:`rlctl.rewards.custom`); ``Name`` is an :class:`~rlctl.agents.env.Environment` subclass
or a zero-argument callable returning an object with ``start(row)`` and ``step(turn)``. One
instance runs one episode.

Per row, verl's ``agent_name`` (read from ``extra_info.agent_name``) picks the agent:
absent, ``tool_agent`` or the environment's own name run the profile's environment;
``single_turn_agent`` runs it for one model turn.
"""

from __future__ import annotations

import importlib.util
import inspect
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlctl.agents.env import Environment
from rlctl.errors import UserError

BUILTIN = "builtin:"
SINGLE_TURN_AGENT, TOOL_AGENT = "single_turn_agent", "tool_agent"  # verl's registered agent names

EnvFactory = Callable[[], Environment]


def builtin_environments() -> dict[str, EnvFactory]:
    from rlctl.agents.builtin import CalculatorEnv, GuessEnv

    return {"calculator": CalculatorEnv, "guess": GuessEnv}


def parse_env_spec(spec: str) -> tuple[Path, str]:
    """``file.py:Name`` -> (path, name); the name is required."""
    path, sep, name = spec.rpartition(":")
    if not sep or not path or not name or "/" in name or not path.endswith(".py"):
        raise UserError(f"agent.env: expected 'builtin:NAME' or 'path/to/file.py:ClassName', got {spec!r}")
    return Path(path), name


def _import_file(path: Path, key: str = "agent.env") -> Any:
    module_name = f"rlctl_user_env_{abs(hash(str(path.resolve())))}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    loader_spec = importlib.util.spec_from_file_location(module_name, path)
    if loader_spec is None or loader_spec.loader is None:
        raise UserError(f"{key}: cannot import {path}")
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[module_name] = module  # pickling / dataclasses inside the file
    try:
        loader_spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(module_name, None)
        raise UserError(f"{key}: {path} failed to import: {type(exc).__name__}: {exc}") from None
    return module


def load_environment(spec: str, base_dir: str | Path | None = None) -> EnvFactory:
    """The factory named by ``spec``; a relative file path resolves against ``base_dir``."""
    if spec.startswith(BUILTIN):
        name = spec[len(BUILTIN) :]
        known = builtin_environments()
        if name not in known:
            raise UserError(
                f"agent.env: unknown built-in {name!r}; expected one of: {', '.join(sorted(known))}"
            )
        return known[name]
    path, name = parse_env_spec(spec)
    if not path.is_absolute() and base_dir is not None:
        path = Path(base_dir) / path
    if not path.is_file():
        raise UserError(f"agent.env: file not found: {path} (from {spec!r})")
    factory = getattr(_import_file(path), name, None)
    if factory is None or not callable(factory):
        raise UserError(f"agent.env: {name!r} not found in {path} (expected an Environment class)")
    try:
        probe = factory()
    except TypeError as exc:
        raise UserError(f"agent.env: {name} in {path} must take no arguments: {exc}") from None
    missing = [m for m in ("start", "step") if not callable(getattr(probe, m, None))]
    if missing:
        raise UserError(
            f"agent.env: {name} in {path} has no {' / '.join(missing)} method (subclass Environment)"
        )
    return factory


def turns_for_row(extra_info: dict[str, Any] | None, env_name: str, max_turns: int) -> int:
    """The row's turn limit from its verl ``agent_name`` (RunError for an agent that is not here)."""
    agent = (extra_info or {}).get("agent_name")
    if agent in (None, "", TOOL_AGENT, env_name):
        return max_turns
    if agent == SINGLE_TURN_AGENT:
        return 1
    raise UserError(
        f"row asks for agent_name {agent!r}; this run has {env_name!r} ({TOOL_AGENT}) and {SINGLE_TURN_AGENT}"
    )


def load_agent_function(spec: str, base_dir: str | Path | None = None) -> Callable[..., Any]:
    """``agent.openai_agent``: the ``async def run(client, row)`` named by ``path/to/file.py:name``
    (the name defaults to ``run``), imported from its path like a reward function."""
    key = "agent.openai_agent"
    path_s, sep, name = spec.rpartition(":")
    if not sep or "/" in name or name.endswith(".py"):
        path_s, name = spec, "run"
    path = Path(path_s)
    if path.suffix != ".py":
        raise UserError(f"{key}: expected 'path/to/file.py[:function]', got {spec!r}")
    if not path.is_absolute() and base_dir is not None:
        path = Path(base_dir) / path
    if not path.is_file():
        raise UserError(f"{key}: file not found: {path} (from {spec!r})")
    fn = getattr(_import_file(path, key), name, None)
    if fn is None or not callable(fn):
        raise UserError(f"{key}: {name!r} not found in {path} (expected 'async def {name}(client, row)')")
    if not inspect.iscoroutinefunction(fn):
        raise UserError(
            f"{key}: {name} in {path} must be 'async def {name}(client, row)' (a coroutine function)"
        )
    try:
        inspect.signature(fn).bind(None, {})
    except TypeError:
        raise UserError(f"{key}: {name} in {path} must take (client, row)") from None
    return fn
