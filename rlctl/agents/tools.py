"""Tools as plain Python functions, their OpenAI function-calling schema, and Hermes tool-call parsing.

A tool is any function with type hints; its schema (``{"type": "function", "function": {name,
description, parameters}}``) is derived from the signature and the docstring's first line, or
given explicitly. The row's ``extra_info.tools_kwargs[<tool>]["create_kwargs"]`` (verl's layout)
fill parameters; keyword-only ones (after ``*``) come only from there and are never shown to the
model.

Tool calls are parsed in the Hermes format that Qwen2.5/Qwen3 chat templates declare:
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (the same regex and JSON shape as
verl's ``HermesToolParser``, verl/experimental/agent_loop/tool_parser.py). A call that cannot be
parsed or run is an error string for that sample, never an exception.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import re
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rlctl.errors import UserError

TOOL_CALL_START, TOOL_CALL_END = "<tool_call>", "</tool_call>"
_TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_JSON_TYPES: dict[Any, str] = {
    int: "integer",
    float: "number",
    str: "string",
    bool: "boolean",
    list: "array",
    dict: "object",
}


@dataclass(frozen=True)
class Tool:
    """A callable the model may call by ``name``; ``schema`` is its OpenAI function-calling schema."""

    name: str
    fn: Callable[..., Any]
    schema: dict[str, Any]
    hidden: tuple[str, ...] = ()  # keyword-only parameters filled from the row, not by the model

    def __call__(self, **kwargs: Any) -> Any:
        return self.fn(**kwargs)


@dataclass(frozen=True)
class ToolCall:
    """One parsed call: the tool's name and its JSON arguments."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


def _json_type(annotation: Any) -> dict[str, Any]:
    origin = typing.get_origin(annotation) or annotation
    if origin in _JSON_TYPES:
        return {"type": _JSON_TYPES[origin]}
    return {}  # untyped or a union: any JSON value


def function_schema(fn: Callable[..., Any], name: str | None = None) -> dict[str, Any]:
    """The OpenAI function-calling schema of ``fn`` from its signature, type hints and docstring."""
    sig = inspect.signature(fn)
    hints = typing.get_type_hints(fn)
    props: dict[str, Any] = {}
    required: list[str] = []
    for p in sig.parameters.values():
        if p.kind is not inspect.Parameter.POSITIONAL_OR_KEYWORD:
            continue
        props[p.name] = _json_type(hints.get(p.name, Any))
        if p.default is inspect.Parameter.empty:
            required.append(p.name)
    doc = inspect.getdoc(fn) or ""
    return {
        "type": "function",
        "function": {
            "name": name or fn.__name__,
            "description": doc.split("\n", 1)[0],
            "parameters": {"type": "object", "properties": props, "required": required},
        },
    }


def as_tool(obj: Callable[..., Any] | Tool, schema: Mapping[str, Any] | None = None) -> Tool:
    """A :class:`Tool` from a function (schema derived unless given) or a Tool as it is."""
    if isinstance(obj, Tool):
        return obj
    if not callable(obj):
        raise UserError(f"tool {obj!r} is not callable: tools are plain Python functions")
    schema = dict(schema) if schema is not None else function_schema(obj)
    name = schema.get("function", {}).get("name") or obj.__name__
    hidden = tuple(
        p.name for p in inspect.signature(obj).parameters.values() if p.kind is inspect.Parameter.KEYWORD_ONLY
    )
    return Tool(name=name, fn=obj, schema=schema, hidden=hidden)


def tool_registry(tools: Sequence[Callable[..., Any] | Tool]) -> dict[str, Tool]:
    """Name -> Tool; two tools of one name are a UserError."""
    out: dict[str, Tool] = {}
    for t in map(as_tool, tools):
        if t.name in out:
            raise UserError(f"two tools are named {t.name!r}; tool names must be unique")
        out[t.name] = t
    return out


def parse_tool_calls(text: str) -> tuple[str, list[ToolCall], list[str]]:
    """Hermes-format calls in a model turn: (text without the calls, parsed calls, errors).

    Each ``<tool_call>`` body must be a JSON object with a string ``name`` and an ``arguments``
    object (a JSON string holding an object is accepted, as some models emit it). An opening tag
    without its closing tag is an error too.
    """
    calls: list[ToolCall] = []
    errors: list[str] = []
    for body in _TOOL_CALL_RE.findall(text):
        try:
            obj = json.loads(body)
        except ValueError as exc:
            errors.append(f"tool call is not valid JSON ({exc.msg} at char {exc.pos}): {body.strip()[:80]}")
            continue
        except RecursionError:  # the model's JSON, nested past the parser's depth: its error, not ours
            errors.append(f"tool call JSON is nested too deeply to parse: {body.strip()[:80]}")
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            errors.append(f"tool call needs a JSON object with a string 'name': {body.strip()[:80]}")
            continue
        args = obj.get("arguments", {})
        if isinstance(args, str):
            with contextlib.suppress(ValueError, RecursionError):
                args = json.loads(args)
        if not isinstance(args, dict):
            errors.append(f"tool call {obj['name']!r}: 'arguments' must be a JSON object, got {args!r:.60}")
            continue
        calls.append(ToolCall(obj["name"], args))
    rest = _TOOL_CALL_RE.sub("", text)
    if TOOL_CALL_START in rest:
        errors.append(f"unterminated tool call: {TOOL_CALL_START} without {TOOL_CALL_END}")
    return rest, calls, errors


def run_tool_call(
    call: ToolCall, tools: Mapping[str, Tool], tools_kwargs: Mapping[str, Any] | None = None
) -> tuple[str, str | None]:
    """(tool response text, error or None). Unknown tools, bad arguments and raising tools are errors.

    ``tools_kwargs`` is the row's verl-style ``{tool: {"create_kwargs": {...}}}``: those values fill
    the tool's parameters (keyword-only ones can only come from there) and win over anything the
    model passed.
    """
    tool = tools.get(call.name)
    if tool is None:
        return "", f"unknown tool {call.name!r} (available: {', '.join(sorted(tools)) or 'none'})"
    params = tool.schema.get("function", {}).get("parameters", {})
    allowed = set(params.get("properties", {}))
    row = dict((tools_kwargs or {}).get(call.name, {}).get("create_kwargs", {}))
    row = {k: v for k, v in row.items() if k in allowed or k in tool.hidden}
    missing = [p for p in params.get("required", []) if p not in call.arguments and p not in row]
    extra = [a for a in call.arguments if a not in allowed]
    if missing or extra:
        what = "; ".join(
            s
            for s in (
                f"missing {', '.join(missing)}" if missing else "",
                f"unexpected {', '.join(extra)}" if extra else "",
            )
            if s
        )
        return "", f"tool {call.name!r}: bad arguments ({what})"
    kwargs = {**call.arguments, **row}
    try:
        result = tool(**kwargs)
    except Exception as exc:  # the tool's failure is the sample's error, not the run's
        return "", f"tool {call.name!r} raised {type(exc).__name__}: {exc}"
    return result if isinstance(result, str) else json.dumps(result), None
