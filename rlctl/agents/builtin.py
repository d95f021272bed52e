"""Built-in environments, named ``builtin:NAME`` in a profile's ``agent.env``."""

from __future__ import annotations

from rlctl.agents.env import Environment, Row, Step, ToolEnvironment, Turn
from rlctl.agents.tools import Tool, as_tool
from rlctl.rewards.sandbox import SandboxLimits, run_python


def mul(a: int, b: int) -> int:
    """Multiply two integers."""
    if not isinstance(a, int) or not isinstance(b, int) or isinstance(a, bool) or isinstance(b, bool):
        raise TypeError("a and b must be integers")
    return a * b


class CalculatorEnv(ToolEnvironment):
    """The ``calculator`` task's environment: a ``mul`` tool; reward 1 when the final answer (a turn
    without a tool call) is the row's ground truth, else 0."""

    name = "calculator"
    tools = (mul,)

    def reward(self, answer: str, row: Row) -> float:
        return float(answer.strip() == str(row["ground_truth"]).strip())


def python_tool(limits: SandboxLimits | None = None) -> Tool:
    """A ``python`` tool that runs the model's code in rlctl's sandbox (:mod:`rlctl.rewards.sandbox`:
    namespaces, an unprivileged uid, time and memory limits) and returns what it prints. A run that
    fails or is refused is the call's error, counted as a tool error."""

    def python(code: str) -> str:
        """Run a Python program and return what it prints."""
        result = run_python(code, limits=limits or SandboxLimits())
        if not result.ok:
            raise RuntimeError(result.reason)
        return result.stdout

    return as_tool(python)


class GuessEnv(Environment):
    """The ``guess`` task's environment: each turn is a guess of the secret (the row's ground truth)
    in ``0..hi``; ``higher`` / ``lower`` until it is right (reward 1). A turn that is not a number is
    the end of the episode (reward 0)."""

    name = "guess"

    def step(self, turn: Turn) -> Step:
        text = turn.text.strip()
        secret = int(self.row["ground_truth"])
        if not text.isdigit():
            return Step(done=True, reward=0.0)
        guess = int(text)
        if guess == secret:
            return Step(done=True, reward=1.0)
        return Step(messages=[{"role": "user", "content": "higher" if guess < secret else "lower"}])
