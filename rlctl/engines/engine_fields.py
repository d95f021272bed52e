"""The engine keywords of a run: the platform's settings plus ``rollout.engine_kwargs``, checked.

One function, :func:`resolve_engine_kwargs`, gives the keywords the rollout engine is built with
and refuses, in one line, what the installed engine would reject or the platform knows cannot run:

- a key rlctl sets from another profile key (``dtype``, ``seed`` ...): :data:`RESERVED`;
- a key the installed version's config class lacks. ``vllm.LLM(**kw)`` builds
  ``EngineArgs(**kw)``, a dataclass (``vllm/engine/arg_utils.py``, 0.10.2-0.33.0);
  ``sglang.Engine(**kw)`` builds ``ServerArgs(**kw)``, a dataclass through 0.5.19
  (``sglang/srt/server_args.py``) and from 0.5.20 a msgspec struct whose fields live in the
  classes named by ``_INPUT_NAMESPACES`` (``sglang/srt/arg_groups/fields/*.py``). Both raise on an
  unknown keyword. The field list is read from the installed source with :mod:`ast` (nothing is
  imported on the driver), the same way ``ci/api_surface.py`` records it;
- a kernel the platform refuses (:meth:`~rlctl.platforms.base.Platform.kernel_problem`).
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from typing import Any

from rlctl.errors import UserError
from rlctl.platforms.base import Platform
from rlctl.platforms.dists import DistIndex

# engine keyword -> the profile key (or rlctl mechanism) that sets it
RESERVED: dict[str, dict[str, str]] = {
    "vllm": {
        "model": "model.path",
        "dtype": "platform.dtype",
        "seed": "run.seed",
        "tensor_parallel_size": "rollout.tensor_parallel",
        "gpu_memory_utilization": "rollout.gpu_memory_utilization",
        "trust_remote_code": "model.trust_remote_code",
        "enable_sleep_mode": "rlctl's colocated sleep/wake",
        "worker_extension_cls": "rlctl's in-place weight sync",
        "skip_tokenizer_init": "rlctl's token-id prompts",
        "logprobs_mode": "rlctl's rollout log-prob check",
    },
    "sglang": {
        "model_path": "model.path",
        "dtype": "platform.dtype",
        "random_seed": "run.seed",
        "tp_size": "rollout.tensor_parallel",
        "mem_fraction_static": "rollout.gpu_memory_utilization",
        "trust_remote_code": "model.trust_remote_code",
        "enable_memory_saver": "rlctl's colocated sleep/wake",
        "enable_weights_cpu_backup": "rlctl's colocated sleep/wake",
        "skip_tokenizer_init": "rlctl's token-id prompts",
    },
}
CONFIG_CLASS = {"vllm": "EngineArgs", "sglang": "ServerArgs"}
# the other engine's length key -> this engine's (vllm EngineArgs.max_model_len, sglang
# ServerArgs.context_length; neither class has the other's), refused whether or not it is installed
OTHER_ENGINES_KEY: dict[str, dict[str, str]] = {
    "vllm": {"context_length": "max_model_len"},
    "sglang": {"max_model_len": "context_length"},
}


def _class(tree: ast.Module, name: str) -> ast.ClassDef | None:
    return next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name), None)


def _annotated(cls: ast.ClassDef) -> list[str]:
    """Class-level ``name: type [= default]`` that are not ClassVars (dataclass / msgspec fields;
    vLLM 0.33's ``EngineArgs`` has init fields like ``_api_process_count``)."""
    return [
        n.target.id
        for n in cls.body
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and n.simple
        if not n.target.id.startswith("__")
        and not ast.unparse(n.annotation).startswith(("ClassVar", "typing.ClassVar"))
    ]


def _parse(dists: DistIndex, dist: str, relpath: str) -> ast.Module | None:
    path = dists.locate(dist, relpath)
    if path is None:
        return None
    try:
        return ast.parse(path.read_text(encoding="utf-8", errors="replace"))
    except (OSError, SyntaxError, ValueError):
        return None


def installed_fields(engine: str, dists: DistIndex) -> frozenset[str] | None:
    """The keyword names the installed engine's config class takes (None: not readable here)."""
    if engine == "vllm":
        tree = _parse(dists, "vllm", "vllm/engine/arg_utils.py")
        cls = _class(tree, "EngineArgs") if tree else None
        return frozenset(_annotated(cls)) if cls else None
    if engine == "sglang":
        tree = _parse(dists, "sglang", "sglang/srt/server_args.py")
        cls = _class(tree, "ServerArgs") if tree else None
        if cls is None:
            return None
        fields = set(_annotated(cls))
        for node in tree.body:  # 0.5.20+: the namespaces the struct is assembled from
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "_INPUT_NAMESPACES" for t in node.targets
            ):
                for name in (e.id for e in getattr(node.value, "elts", []) if isinstance(e, ast.Name)):
                    found = _namespace(dists, name)
                    if found is None:
                        return None
                    fields |= found
        return frozenset(fields)
    return None


def _namespace(dists: DistIndex, name: str) -> set[str] | None:
    """Fields of one ServerArgs namespace class under ``sglang/srt/arg_groups/fields/``."""
    server_args = dists.locate("sglang", "sglang/srt/server_args.py")
    if server_args is None:
        return None
    for path in sorted((server_args.parent / "arg_groups" / "fields").glob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        if f"class {name}" not in text:
            continue
        cls = _class(ast.parse(text), name)
        if cls is not None:  # private namespace members are not ServerArgs keywords (ci/api_surface.py)
            return {f for f in _annotated(cls) if not f.startswith("_")}
    return None


def check_engine_kwargs(
    engine: str, kwargs: Mapping[str, Any], *, version: str, fields: frozenset[str] | None, where: str
) -> None:
    """UserError, one line, for a reserved key or one the installed version does not know."""
    for key in kwargs:
        owner = RESERVED.get(engine, {}).get(key)
        if owner is not None:
            raise UserError(f"{where}.{key}: set by {owner}, not here")
        own = OTHER_ENGINES_KEY.get(engine, {}).get(key)
        if own is not None:
            raise UserError(f"{where}.{key}: {engine} has no {key!r}; its length key is {own!r}")
        if fields is not None and key not in fields:
            raise UserError(
                f"{where}.{key}: {engine} {version} has no {CONFIG_CLASS[engine]} field {key!r} "
                f"(expected one of the installed {engine}'s {len(fields)} {CONFIG_CLASS[engine]} fields)"
            )


def resolve_engine_kwargs(
    platform: Platform, engine: str, profile_kwargs: Mapping[str, Any], *, where: str
) -> dict[str, Any]:
    """The keywords ``engine`` is built with on ``platform``: its :meth:`engine_settings` keywords
    under ``profile_kwargs`` (``rollout.engine_kwargs``, which win), every one checked.

    ``where`` names the profile key in messages (``profile.toml: rollout.engine_kwargs``).
    """
    settings = platform.engine_settings(engine)
    if engine not in CONFIG_CLASS:
        if profile_kwargs:
            raise UserError(
                f"{where}: set, but the {engine} rollout engine reads no engine keywords (only vllm/sglang do)"
            )
        return dict(settings.engine_kwargs)
    merged = {**settings.engine_kwargs, **profile_kwargs}
    version = platform.host.dists.version(engine) or "(not installed)"
    fields = installed_fields(engine, platform.host.dists)
    check_engine_kwargs(engine, profile_kwargs, version=version, fields=fields, where=where)
    check_engine_kwargs(
        engine, merged, version=version, fields=fields, where=f"{platform.name} engine settings"
    )
    problem = platform.kernel_problem(engine, merged)
    if problem:
        raise UserError(f"{where}: {problem}")
    return merged
