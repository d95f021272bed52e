"""A sampled answer as the endpoint returns it: cut at a stop string, tool calls parsed out.

The tokens kept are the tokens sampled up to the stop (the engine's eos token, or the token whose
text completes a ``stop`` string); the content the agent sees leaves the stop out, as OpenAI's
does. Tool calls are parsed in the Hermes format (:func:`rlctl.agents.tools.parse_tool_calls`)
and returned in OpenAI's ``tool_calls`` shape with fresh ids; a malformed call stays in the
content as text. ``raw`` is what the model wrote (the stop string kept, the eos token not): the
trajectory renders that back when the agent sends the message again.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from typing import Any

from rlctl.agents.completions import Choice
from rlctl.agents.tools import parse_tool_calls


@dataclass
class Answer:
    choice: Choice
    ids: list[int]  # the sampled ids kept (eos included when sampled)
    log_probs: list[float]
    raw: str  # the text the model wrote, eos left out
    tool_errors: int


def cut_at_stop(
    tokenizer: Any, ids: list[int], log_probs: list[float], stops: list[str], eos: set[int]
) -> tuple[list[int], list[float], str | None]:
    """Ids and log-probs up to the first eos or stop string; the reason (stop / None: not stopped)."""
    for k, t in enumerate(ids):
        if t in eos:
            return ids[: k + 1], log_probs[: k + 1], "stop"
        if stops:
            text = tokenizer.decode(ids[: k + 1], skip_special_tokens=False)
            if any(s in text for s in stops):
                return ids[: k + 1], log_probs[: k + 1], "stop_string"
    return ids, log_probs, None


def make_answer(
    tokenizer: Any,
    ids: list[int],
    log_probs: list[float],
    *,
    stops: list[str],
    eos: set[int],
    parse_tools: bool,
) -> Answer:
    """The :class:`Answer` for one sampled row."""
    ids, log_probs, why = cut_at_stop(tokenizer, ids, log_probs, stops, eos)
    body = ids[:-1] if why == "stop" else ids
    raw = tokenizer.decode(body, skip_special_tokens=False)
    content = raw
    if why == "stop_string":
        content = raw[: min(raw.find(s) for s in stops if s in raw)]
    finish = "length" if why is None else "stop"
    calls: list[dict[str, Any]] = []
    errors: list[str] = []
    if parse_tools:
        rest, parsed, errors = parse_tool_calls(content)
        if parsed and not errors:
            content = rest.strip()
            calls = [
                {
                    "id": f"call_{secrets.token_hex(8)}",
                    "type": "function",
                    "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
                }
                for c in parsed
            ]
            finish = "tool_calls"
    tokens = [tokenizer.decode([t], skip_special_tokens=False) for t in ids]
    choice = Choice(
        content=content if (content or not calls) else None,
        tool_calls=calls,
        finish_reason=finish,
        tokens=tokens,
        log_probs=list(log_probs),
    )
    return Answer(choice=choice, ids=ids, log_probs=log_probs, raw=raw, tool_errors=len(errors))
