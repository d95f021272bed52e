"""Multi-digit multiplication with a calculator tool: the built-in multi-turn task.

The model cannot multiply three-digit by two-digit numbers itself (the tiny models cannot), so it
must call the ``mul`` tool of the ``builtin:calculator`` environment and copy the result::

    user       "123*45="
    assistant  <tool_call>{"name":"mul","arguments":{}}</tool_call>   (then EOS)
    tool       5535
    assistant  "5535"                                                  (then EOS)

By default the operands reach the tool from the row, in verl's layout
(``extra_info.tools_kwargs = {"mul": {"create_kwargs": {"a": 123, "b": 45}}}``), the way verl's
GSM8K tool gets its ground truth. ``operands_in_call=1`` makes the model write them
(``{"name":"mul","arguments":{"a":123,"b":45}}``) and sends no tools_kwargs. Measured on a 2-core
CPU: the 1M-parameter model's SFT on these traces learned the call but not to copy the result
into its answer (the loss stayed at the no-copy level: 150 steps with the operands in the call,
80 with them from the row), so the built-in task that
learns here is ``guess`` (:mod:`rlctl.data.tasks.guess`).

``extra_info.answer`` is the whole episode after the prompt as the built-in tiny model's chat
template renders it (its template has no tool role: tool results are a user turn), so
``rlctl sft`` can warm a model up on complete traces; ``extra_info.tool_call`` is the expected
first turn.
"""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Iterator
from typing import Any

from rlctl.data.tasks.base import ENUMERATE_LIMIT, Task, strip_answer

TOOL_NAME = "mul"


def tool_call_text(a: int, b: int, operands_in_call: bool = False) -> str:
    """The Hermes-format call of the ``mul`` tool, compact JSON (what the SFT traces teach)."""
    args = {"a": a, "b": b} if operands_in_call else {}
    body = json.dumps({"name": TOOL_NAME, "arguments": args}, separators=(",", ":"))
    return f"<tool_call>{body}</tool_call>"


def tiny_trace(a: int, b: int, operands_in_call: bool = False) -> str:
    """The episode after the prompt in the built-in tiny template (the final EOS left out)."""
    product = a * b
    return f"{tool_call_text(a, b, operands_in_call)}<|eos|><|user|>{product}<|assistant|>{product}"


class CalculatorTask(Task):
    """a*b with a ``digits_a``-digit and a ``digits_b``-digit operand; the answer is the product."""

    name = "calculator"
    val_fraction = 0.05

    def __init__(self, digits_a: int = 3, digits_b: int = 2, operands_in_call: int = 0) -> None:
        self.operands_in_call = bool(operands_in_call)
        for key, d in (("digits_a", digits_a), ("digits_b", digits_b)):
            if not 1 <= int(d) <= 9:
                raise ValueError(f"{key} must be in 1..9, got {d}")
        self.ranges = [
            (10 ** (int(d) - 1) if int(d) > 1 else 0, 10 ** int(d) - 1) for d in (digits_a, digits_b)
        ]

    def sample(self, rng: random.Random) -> tuple[int, int]:
        return tuple(rng.randint(lo, hi) for lo, hi in self.ranges)  # type: ignore[return-value]

    def enumerate(self) -> Iterator[tuple[int, int]] | None:
        (la, ha), (lb, hb) = self.ranges
        if (ha - la + 1) * (hb - lb + 1) > ENUMERATE_LIMIT:
            return None
        return itertools.product(range(la, ha + 1), range(lb, hb + 1))

    def key(self, problem: tuple[int, int]) -> str:
        return f"{problem[0]}*{problem[1]}"

    def row_parts(self, problem: tuple[int, int]) -> tuple[str, Any, str, dict[str, Any]]:
        a, b = problem
        extra: dict[str, Any] = {
            "a": a,
            "b": b,
            "tool_call": tool_call_text(a, b, self.operands_in_call),
            "agent_name": "tool_agent",
        }
        if not self.operands_in_call:
            extra["tools_kwargs"] = {TOOL_NAME: {"create_kwargs": {"a": a, "b": b}}}
        return f"{a}*{b}=", str(a * b), tiny_trace(a, b, self.operands_in_call), extra

    def verify(self, solution_str: str, ground_truth: Any) -> float:
        """The final answer (text after the last tool call, if any) equals the product."""
        return float(strip_answer(solution_str.rsplit("</tool_call>", 1)[-1]) == str(ground_truth).strip())
