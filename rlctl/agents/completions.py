"""The Chat Completions request the endpoint accepts, and the responses it sends (OpenAI's shapes).

Read from the ``openai`` package's request and response types (openai 3.63.0:
``openai/types/chat/completion_create_params.py``, ``chat_completion.py``,
``chat_completion_chunk.py``; streaming is server-sent events ended by ``data: [DONE]``, as
``openai/_streaming.py`` parses them). Served: ``messages``, ``tools`` / ``tool_choice``,
``temperature`` (0 is greedy), ``top_p``, ``max_tokens`` / ``max_completion_tokens``, ``stop``,
``n``, ``logprobs``, ``stream`` (with ``stream_options.include_usage``). Parameters that would
change sampling in a way the engine cannot (penalties, ``logit_bias``, ``top_logprobs``, a JSON
``response_format``) are refused with a 400 rather than ignored; others (``seed``, ``user``,
``parallel_tool_calls``, ``metadata``, ``store``) do not change what is sampled here and are
accepted.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

ROLES = ("system", "developer", "user", "assistant", "tool")


class ApiError(Exception):
    """An OpenAI-style error response: ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "") -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param
        self.kind = kind or ("invalid_request_error" if status < 500 else "server_error")

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": None}}


@dataclass
class ChatRequest:
    """One validated request: what the batcher samples and the trajectory records."""

    messages: list[dict[str, Any]]
    model: str = "rlctl"
    tools: list[dict[str, Any]] = field(default_factory=list)
    tool_choice: Any = "auto"
    temperature: float | None = None  # None: the profile's rollout.temperature
    top_p: float | None = None
    max_tokens: int | None = None
    stop: list[str] = field(default_factory=list)
    n: int = 1
    logprobs: bool = False
    stream: bool = False
    include_usage: bool = False

    @property
    def parse_tools(self) -> bool:
        """Tool calls are parsed out of the text unless the request offers none or says ``none``."""
        return bool(self.tools) and self.tool_choice != "none"


def _number(body: Mapping[str, Any], key: str, default: float | None, lo: float, hi: float) -> float | None:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo <= value <= hi:
        raise ApiError(400, f"'{key}' must be a number in [{lo}, {hi}], got {value!r}", key)
    return float(value)


def _integer(body: Mapping[str, Any], key: str, lo: int, hi: int) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ApiError(400, f"'{key}' must be an integer in [{lo}, {hi}], got {value!r}", key)
    return value


def _messages(value: Any) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not value:
        raise ApiError(400, "'messages' must be a non-empty array of messages", "messages")
    for i, m in enumerate(value):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise ApiError(
                400, f"messages[{i}] must be an object with a 'role' in {', '.join(ROLES)}", f"messages[{i}]"
            )
        content = m.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise ApiError(400, f"messages[{i}].content must be a string or an array", f"messages[{i}]")
        if m["role"] != "assistant" and content is None:
            raise ApiError(400, f"messages[{i}] ({m['role']}) has no 'content'", f"messages[{i}]")
    return value


def _tools(body: Mapping[str, Any]) -> tuple[list[dict[str, Any]], Any]:
    tools = body.get("tools") or []
    if not isinstance(tools, list) or any(
        not isinstance(t, dict) or t.get("type") != "function" or not isinstance(t.get("function"), dict)
        for t in tools
    ):
        raise ApiError(400, "'tools' must be an array of {'type': 'function', 'function': {...}}", "tools")
    choice = body.get("tool_choice", "auto" if tools else "none")
    ok = choice in ("none", "auto", "required") or (
        isinstance(choice, dict) and isinstance(choice.get("function"), dict)
    )
    if not ok:
        raise ApiError(400, f"'tool_choice' must be none, auto, required or a function, got {choice!r}")
    return tools, choice


def parse_request(raw: bytes, max_n: int = 16) -> ChatRequest:
    """The request body as a :class:`ChatRequest`, or an :class:`ApiError` (400) saying what is wrong."""
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        raise ApiError(400, "the request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    for key in ("presence_penalty", "frequency_penalty"):
        if body.get(key) not in (None, 0, 0.0):
            raise ApiError(400, f"'{key}' is not served by this endpoint (it would change sampling)", key)
    if body.get("logit_bias"):
        raise ApiError(400, "'logit_bias' is not served by this endpoint", "logit_bias")
    if body.get("top_logprobs"):
        raise ApiError(400, "'top_logprobs' is not served: the engine returns the sampled token's only")
    fmt = body.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") not in (None, "text"):
        raise ApiError(400, "'response_format' other than text is not served", "response_format")
    stop = body.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or len(stop) > 4 or not all(isinstance(s, str) and s for s in stop):
        raise ApiError(400, "'stop' must be a string or up to 4 non-empty strings", "stop")
    tools, choice = _tools(body)
    max_tokens = _integer(body, "max_completion_tokens", 1, 1 << 20)
    if max_tokens is None:
        max_tokens = _integer(body, "max_tokens", 1, 1 << 20)
    options = body.get("stream_options") or {}
    return ChatRequest(
        messages=_messages(body.get("messages")),
        model=str(body.get("model") or "rlctl"),
        tools=tools,
        tool_choice=choice,
        temperature=_number(body, "temperature", None, 0.0, 2.0),
        top_p=_number(body, "top_p", None, 1e-9, 1.0),
        max_tokens=max_tokens,
        stop=stop,
        n=_integer(body, "n", 1, max_n) or 1,
        logprobs=bool(body.get("logprobs")),
        stream=bool(body.get("stream")),
        include_usage=bool(isinstance(options, dict) and options.get("include_usage")),
    )


@dataclass
class Choice:
    """One sampled answer as the endpoint returns it."""

    content: str | None
    tool_calls: list[dict[str, Any]]
    finish_reason: str  # stop, length or tool_calls
    tokens: list[str]  # each sampled token's text (for logprobs)
    log_probs: list[float]


def _logprobs(c: Choice) -> dict[str, Any]:
    return {
        "content": [
            {"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
            for t, lp in zip(c.tokens, c.log_probs, strict=True)
        ],
        "refusal": None,
    }


def _message(c: Choice) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant", "content": c.content, "refusal": None}
    if c.tool_calls:
        msg["tool_calls"] = c.tool_calls
    return msg


def completion(rid: str, req: ChatRequest, choices: list[Choice], prompt_tokens: int) -> dict[str, Any]:
    """A ``chat.completion`` object."""
    completion_tokens = sum(len(c.tokens) for c in choices)
    return {
        "id": rid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": req.model,
        "choices": [
            {
                "index": i,
                "message": _message(c),
                "finish_reason": c.finish_reason,
                "logprobs": _logprobs(c) if req.logprobs else None,
            }
            for i, c in enumerate(choices)
        ],
        "usage": _usage(prompt_tokens, completion_tokens),
    }


def _usage(prompt: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt + completion_tokens,
    }


def stream_chunks(
    rid: str, req: ChatRequest, choices: list[Choice], prompt_tokens: int
) -> list[dict[str, Any]]:
    """The ``chat.completion.chunk`` events of a streamed answer (sent once the answer is sampled:
    a role delta, the content, the tool calls, the finish reason, then usage if asked)."""
    created = int(time.time())

    def chunk(index: int, delta: dict[str, Any], finish: str | None, lp: Any = None) -> dict[str, Any]:
        return {
            "id": rid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": req.model,
            "choices": [{"index": index, "delta": delta, "finish_reason": finish, "logprobs": lp}],
        }

    out = []
    for i, c in enumerate(choices):
        out.append(chunk(i, {"role": "assistant", "content": ""}, None))
        if c.content:
            out.append(chunk(i, {"content": c.content}, None, _logprobs(c) if req.logprobs else None))
        if c.tool_calls:
            calls = [{"index": k, **call} for k, call in enumerate(c.tool_calls)]
            out.append(chunk(i, {"tool_calls": calls}, None))
        out.append(chunk(i, {}, c.finish_reason))
    if req.include_usage:
        last = chunk(0, {}, None)
        last["choices"] = []
        last["usage"] = _usage(prompt_tokens, sum(len(c.tokens) for c in choices))
        out.append(last)
    return out
