"""One episode's token-exact trajectory across the requests its agent sends to the endpoint.

Every request's messages are rendered by the chat template (:mod:`.chat`); the episode holds
*chains*: the exact ids the engine consumed and sampled so far, with the text they decode to. A
new request extends the longest chain whose text is a prefix of its rendering: only the text
after it is tokenised (mask 0: context), so sampled tokens are never re-tokenised. Assistant
messages the endpoint produced are rendered with the text the model sampled (its tool calls as
written, a stop string kept), which is what makes the rendering line up.

The mismatch rule: a request whose rendering extends no chain (the agent rewrote or dropped
history, or the template re-renders earlier turns) starts a new chain from its full rendering;
this is counted (``agent/prefix_mismatch``) and the episode's training row is the chain of its
last request, so the tokens of the abandoned chain are not trained. With ``n`` > 1 each choice is
a chain; the row follows the first choice of the last request.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Chain:
    """Token ids (prompt then response), which are sampled (mask 1), their log-probs, their text."""

    ids: list[int]
    text: str
    split: int  # ids[:split] are the row's prompt; the rest is its response
    model: list[int] = field(default_factory=list)  # per response token: 1 sampled, 0 context
    log_probs: list[float] = field(default_factory=list)

    @classmethod
    def root(cls, ids: list[int], text: str, width: int) -> Chain:
        """A fresh chain from a full rendering; ids past ``width`` spill into the response as context."""
        split = min(len(ids), width)
        extra = len(ids) - split
        return cls(ids=ids, text=text, split=split, model=[0] * extra, log_probs=[0.0] * extra)

    @property
    def response_len(self) -> int:
        return len(self.ids) - self.split

    def extended(
        self, ids: list[int], text: str, sampled: bool, log_probs: list[float] | None = None
    ) -> Chain:
        return Chain(
            ids=self.ids + ids,
            text=self.text + text,
            split=self.split,
            model=self.model + [int(sampled)] * len(ids),
            log_probs=self.log_probs + (log_probs if log_probs is not None else [0.0] * len(ids)),
        )


@dataclass
class EpisodeTrace:
    """The chains of one episode and what its metrics count."""

    prompt_width: int  # the row's prompt columns; a longer first rendering spills into the response
    chains: list[Chain] = field(default_factory=list)
    last: Chain | None = None
    requests: int = 0
    mismatches: int = 0
    truncated: bool = False
    conversation: list[dict[str, Any]] = field(default_factory=list)  # the last request + its answer
    raw_by_call: dict[str, str] = field(default_factory=dict)
    raw_by_content: dict[str, str] = field(default_factory=dict)

    def sampled_text(self, message: Mapping[str, Any]) -> str | None:
        """The text the model sampled for an assistant message this endpoint returned (None: not ours)."""
        for call in message.get("tool_calls") or []:
            raw = self.raw_by_call.get(str(call.get("id", "")) if isinstance(call, Mapping) else "")
            if raw is not None:
                return raw
        content = message.get("content")
        return self.raw_by_content.get(content) if isinstance(content, str) else None

    def context(self, rendered: str, encode: Any) -> Chain:
        """The chain this request's rendering extends, with the new text appended as context."""
        best = max(
            (c for c in self.chains if rendered.startswith(c.text)), key=lambda c: len(c.text), default=None
        )
        if best is None:
            if self.chains:
                self.mismatches += 1
            return Chain.root(encode(rendered), rendered, self.prompt_width)
        suffix = rendered[len(best.text) :]
        return best.extended(encode(suffix), suffix, sampled=False)

    def record(self, chain: Chain, first: bool) -> None:
        """A chain ending in a sampled answer; the first choice of a request becomes ``last``."""
        self.chains.append(chain)
        if first:
            self.last = chain

    def row(self) -> Chain | None:
        """The training row's chain (None: the agent sent no request that sampled anything)."""
        return self.last
