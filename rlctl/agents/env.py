"""The environment interface a multi-turn task implements: start from a row, answer each model turn.

One environment instance runs one episode. The rollout calls ``start(row)`` once, then
``step(turn)`` after every model turn; a :class:`Step` says what to append (observation
messages, rendered by the model's own chat template) or that the episode is done, and when done,
its reward. :class:`ToolEnvironment` is the common case: the model calls tools until it answers
without a call, then ``reward(answer, row)`` scores the answer.

A row is what the data row holds, in verl's layout: ``prompt`` (chat messages),
``data_source``, ``ground_truth``, ``extra_info``, and, as verl's RL dataset lifts them out of
``extra_info`` (verl/utils/dataset/rl_dataset.py), ``tools_kwargs`` and ``interaction_kwargs``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rlctl.agents.tools import Tool, ToolCall, parse_tool_calls, run_tool_call, tool_registry

Row = Mapping[str, Any]


@dataclass
class Turn:
    """One model turn: its text (stop token removed), the tool calls parsed from it, malformed ones."""

    text: str
    index: int  # 0 for the first model turn
    stopped: bool = True  # ended with a stop token (False: cut by the token budget)
    tool_calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # malformed tool calls in this turn


@dataclass
class Step:
    """The environment's answer to a turn.

    ``messages``: observation messages to append (``{"role": "tool" | "user", "content": ...}``)
    when the episode goes on. ``done``: the episode is over; ``reward`` is its score (None: score
    the final answer with the profile's reward instead). ``success`` (None: ``reward > 0``) and
    ``tool_errors`` (errors the environment counted in this step) feed the ``agent/*`` metrics.
    """

    messages: list[dict[str, str]] = field(default_factory=list)
    done: bool = False
    reward: float | None = None
    success: bool | None = None
    tool_calls: int = 0
    tool_errors: int = 0


class Environment:
    """Base class: override ``step``; ``start`` keeps the row; ``tools`` are offered to the model."""

    tools: Sequence[Callable[..., Any] | Tool] = ()
    truncation_reward: float = 0.0  # reward of an episode cut by the turn or token budget

    def start(self, row: Row) -> None:
        self.row = row

    def step(self, turn: Turn) -> Step:
        raise NotImplementedError

    def on_truncated(self) -> Step:
        """The episode ran out of turns or tokens before it was done."""
        return Step(done=True, reward=self.truncation_reward, success=False)


class ToolEnvironment(Environment):
    """Tool calls are run and their results returned as ``tool`` messages; a turn without a call
    is the final answer, scored by ``reward(answer, row)``.

    A malformed call (bad JSON, unknown tool, wrong arguments, a raising tool) is counted as a tool
    error; with ``stop_on_tool_error`` the episode ends with ``tool_error_reward``, otherwise the
    error text goes back to the model as the tool's response, so it can try again.
    """

    stop_on_tool_error: bool = False
    tool_error_reward: float = 0.0
    max_calls_per_turn: int = 4

    def reward(self, answer: str, row: Row) -> float | None:
        """Score of the final answer; None defers to the profile's reward function."""
        return None

    def step(self, turn: Turn) -> Step:
        registry = getattr(self, "_registry", None)
        if registry is None:
            registry = self._registry = tool_registry(self.tools)
        if not turn.tool_calls and not turn.errors:
            return Step(done=True, reward=self.reward(turn.text, self.row))
        messages: list[dict[str, str]] = [
            {"role": "tool", "content": f"error: {e}"} for e in turn.errors[: self.max_calls_per_turn]
        ]
        errors = len(turn.errors)
        for call in turn.tool_calls[: max(0, self.max_calls_per_turn - len(messages))]:
            text, error = run_tool_call(call, registry, self.row.get("tools_kwargs"))
            errors += error is not None
            messages.append({"role": "tool", "content": f"error: {error}" if error else text})
        calls = len(turn.tool_calls) + len(turn.errors)
        if errors and self.stop_on_tool_error:
            return Step(
                done=True, reward=self.tool_error_reward, success=False, tool_calls=calls, tool_errors=errors
            )
        return Step(messages=messages, tool_calls=calls, tool_errors=errors)


def parse_turn(text: str, index: int, stopped: bool = True) -> Turn:
    """A :class:`Turn` with its Hermes tool calls parsed out of ``text``."""
    _, calls, errors = parse_tool_calls(text)
    return Turn(text=text, index=index, stopped=stopped, tool_calls=calls, errors=errors)
