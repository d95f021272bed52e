"""What an OpenAI-client agent's return value means for its episode's reward (``agent.reward``).

Two rules, picked by the profile:

- ``"agent"`` (the default): the return value decides, as slime keeps a reward its rollout set and
  runs the reward model only where none was set (slime/rollout/sglang_rollout.py), and as AReaL's
  agent workflows return their reward (AReaL docs/en/reference/agent_workflow.md). A number or a
  bool is the reward; a string is the agent's final answer, scored by the profile's ``[reward]``
  against the row's ground truth (the ``solution_str`` of verl's reward functions); None leaves
  it to the profile's ``[reward]`` on the model's decoded tokens of the trained trajectory.
- ``"sum"``: both. The profile's ``[reward]`` scores every episode (the returned answer, else the
  decoded tokens) and the agent's number is added to it (a shaping term: a tool-use bonus, a
  format penalty). The agent returns a number, a string, None, or an ``(answer, number)`` pair.

Success (``acc``) is the profile's reward's wherever it scored the episode; the added number moves
the reward, never the success.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

REWARD_MODES = ("agent", "sum")


@dataclass(frozen=True)
class Outcome:
    """One episode's result: the agent's number (None: none given) and its final answer (None:
    none given)."""

    reward: float | None = None
    answer: str | None = None


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool):
        return float(value)
    if not isinstance(value, (int, float)):
        raise TypeError(f"{what} is {type(value).__name__}; expected a number or a bool")
    out = float(value)
    if not math.isfinite(out):
        raise ValueError(f"{what} is {out}; expected a finite number")
    return out


def read_outcome(value: Any, mode: str = "agent") -> Outcome:
    """The :class:`Outcome` of an agent's return ``value`` under ``agent.reward = mode``; TypeError
    or ValueError (the episode's failure, counted in ``agent/errors``) for anything else."""
    if mode not in REWARD_MODES:
        raise ValueError(f"agent.reward: expected one of {', '.join(REWARD_MODES)}, got {mode!r}")
    if value is None:
        return Outcome()
    if isinstance(value, str):
        return Outcome(answer=value)
    if isinstance(value, (tuple, list)):
        if mode != "sum":
            raise TypeError(
                "the agent returned a pair; an (answer, reward) pair is read with agent.reward = 'sum' "
                "(the profile's reward on the answer plus the agent's number)"
            )
        if len(value) != 2 or not isinstance(value[0], str):
            raise TypeError("the agent returned a pair; expected (answer: str, reward: number)")
        return Outcome(reward=_number(value[1], "the pair's reward"), answer=value[0])
    if not isinstance(value, (bool, int, float)):
        pair = " or an (answer, reward) pair" if mode == "sum" else ""
        raise TypeError(
            f"the agent returned {type(value).__name__}; expected a number, a bool, a string "
            f"(its final answer){pair} or None"
        )
    return Outcome(reward=_number(value, "the agent's return value"))
