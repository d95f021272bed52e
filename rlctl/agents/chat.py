"""Chat-template rendering for the OpenAI-compatible endpoint, and the splice check on a template.

The endpoint renders each request's messages with the model's own template, then appends to the
episode only the text after what the episode already holds (:mod:`.trajectory`). That is exact
when the template is *append-only* for the way the model ends a turn: the rendering of a
conversation up to the generation prompt, plus the assistant's sampled text, plus its stop token,
is a prefix of the rendering of the conversation that follows. :func:`check_template` tests that
on fixed multi-turn conversations (with tools and tool results); ``rlctl check-template`` prints
it and a run whose template fails it is refused.

Messages are normalised first (:func:`normalise`): an assistant message the endpoint produced gets
its sampled text back (tool calls as the model wrote them, not as the template re-formats
them); a ``tool`` message becomes a ``user`` turn for a template without a tool role, as the
native environments' :class:`~rlctl.agents.render.ObservationRenderer` does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rlctl.agents.tools import TOOL_CALL_END, TOOL_CALL_START

Message = dict[str, Any]
_DEMO_TOOL = {
    "type": "function",
    "function": {
        "name": "mul",
        "description": "Multiply two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}
_CALL = f'{TOOL_CALL_START}{{"name": "mul", "arguments": {{"a": 12, "b": 34}}}}{TOOL_CALL_END}'
# the conversations the splice check renders: plain turns, a system prompt, a tool round trip
PROBES: tuple[tuple[str, list[Message], bool], ...] = (
    (
        "plain turns",
        [
            {"role": "user", "content": "Guess a number."},
            {"role": "assistant", "content": "7"},
            {"role": "user", "content": "higher"},
            {"role": "assistant", "content": "9"},
            {"role": "user", "content": "lower"},
        ],
        False,
    ),
    (
        "system prompt",
        [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "4"},
            {"role": "user", "content": "and 3+3?"},
        ],
        False,
    ),
    (
        "tool round trip",
        [
            {"role": "user", "content": "12*34="},
            {"role": "assistant", "content": _CALL},
            {"role": "tool", "content": "408"},
            {"role": "assistant", "content": "408"},
            {"role": "user", "content": "thanks"},
        ],
        True,
    ),
)

# informational: a template that strips earlier reasoning splits a thinking model's episode per turn
REASONING_PROBE: list[Message] = [
    {"role": "user", "content": "Guess a number."},
    {"role": "assistant", "content": "<think>start in the middle</think>5"},
    {"role": "user", "content": "higher"},
]


def renders_tool_role(tokenizer: Any, **kwargs: Any) -> bool:
    """Whether the template accepts a ``tool`` message (the tiny model's raises on it)."""
    probe = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    try:
        tokenizer.apply_chat_template(
            [*probe, {"role": "tool", "content": "x"}], tokenize=False, add_generation_prompt=True, **kwargs
        )
    except Exception:  # jinja raise_exception on an unknown role
        return False
    return True


def normalise(
    messages: Sequence[Mapping[str, Any]],
    *,
    tool_role: bool,
    sampled_text: Callable[[Mapping[str, Any]], str | None] = lambda m: None,
    tool_wrapper: str = "{content}",
) -> list[Message]:
    """Messages as the template should see them: assistant turns the endpoint produced carry their
    sampled text (``sampled_text(message)``, None for one it did not produce), ``tool`` turns are
    ``user`` turns where the template has no tool role, content parts are joined into text."""
    out: list[Message] = []
    for m in messages:
        role = m.get("role")
        content = m.get("content")
        if isinstance(content, list):  # OpenAI content parts: keep the text ones
            content = "".join(p.get("text", "") for p in content if isinstance(p, Mapping))
        if role == "assistant":
            raw = sampled_text(m)
            if raw is not None:
                out.append({"role": "assistant", "content": raw})
                continue
            msg: Message = {"role": "assistant", "content": content or ""}
            if m.get("tool_calls"):
                msg["tool_calls"] = [dict(c) for c in m["tool_calls"]]
            out.append(msg)
        elif role == "tool" and not tool_role:
            out.append({"role": "user", "content": tool_wrapper.format(content=content or "")})
        else:
            msg = {"role": role, "content": content or ""}
            if role == "tool" and m.get("tool_call_id"):
                msg["tool_call_id"] = m["tool_call_id"]
            out.append(msg)
    return out


def render(tokenizer: Any, messages: list[Message], tools: list[dict[str, Any]] | None, **kwargs: Any) -> str:
    """The template's text for ``messages`` with the generation prompt (tools passed when given)."""
    extra = {"tools": tools} if tools else {}
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, **extra, **kwargs
    )


@dataclass
class TemplateCheck:
    """The splice check's verdict: ``ok`` when every probe splices exactly; ``problems`` say where not."""

    ok: bool
    stop_text: str
    tool_role: bool
    problems: list[str] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)
    reasoning_kept: bool = True  # a <think> block in an earlier answer survives the next rendering


def _first_difference(a: str, b: str) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def check_template(tokenizer: Any, **kwargs: Any) -> TemplateCheck:
    """Render each probe conversation turn by turn the way the endpoint splices it and compare.

    For each assistant turn j: ``render(messages[:j]) + content_j + stop`` (what the episode holds
    after the model sampled turn j and its stop token) must be a prefix of
    ``render(messages[:j + 2])`` (what the next request renders). ``stop`` is the eos token's text.
    """
    stop = tokenizer.decode([tokenizer.eos_token_id]) if tokenizer.eos_token_id is not None else ""
    tool_role = renders_tool_role(tokenizer, **kwargs)
    verdict = TemplateCheck(ok=True, stop_text=stop, tool_role=tool_role)
    for name, conversation, with_tools in PROBES:
        msgs = normalise(conversation, tool_role=tool_role)
        tools = [_DEMO_TOOL] if with_tools else None
        try:
            for j, m in enumerate(msgs):
                if m["role"] != "assistant" or j + 1 >= len(msgs):
                    continue
                held = render(tokenizer, msgs[:j], tools, **kwargs) + m["content"] + stop
                nxt = render(tokenizer, msgs[: j + 2], tools, **kwargs)
                if not nxt.startswith(held):
                    at = _first_difference(held, nxt)
                    verdict.ok = False
                    verdict.problems.append(
                        f"{name}, assistant turn {j}: the next request renders {nxt[at : at + 24]!r} "
                        f"where the episode holds {held[at : at + 24]!r} (char {at})"
                    )
                    break
            else:
                verdict.checked.append(name)
        except Exception as exc:  # a template that cannot render the probe at all
            verdict.ok = False
            verdict.problems.append(f"{name}: the template failed to render: {type(exc).__name__}: {exc}")
    verdict.reasoning_kept = _splices(tokenizer, REASONING_PROBE, stop, kwargs)
    return verdict


def _splices(tokenizer: Any, msgs: list[Message], stop: str, kwargs: dict[str, Any]) -> bool:
    try:
        held = render(tokenizer, msgs[:1], None, **kwargs) + msgs[1]["content"] + stop
        return render(tokenizer, msgs, None, **kwargs).startswith(held)
    except Exception:  # a template that cannot render it keeps nothing
        return False
