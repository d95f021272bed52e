"""A user-defined multi-turn environment (the README's example): a calculator tool, reward 1 for
the right final answer. Use it with ``[agent] env = "agent/calculator_env.py:Calculator"``."""

from rlctl.agents import ToolEnvironment


def mul(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


class Calculator(ToolEnvironment):
    tools = [mul]

    def reward(self, answer, row):
        return float(answer.strip() == str(row["ground_truth"]))
