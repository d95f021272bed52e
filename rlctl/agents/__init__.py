"""Multi-turn and agentic RL: environments, tools, and a token-exact multi-turn rollout.

A user environment lives in one small file named by the profile (``agent.env =
"path/to/env.py:ClassName"``), loaded like a custom reward function:

    from rlctl.agents import ToolEnvironment

    def mul(a: int, b: int) -> int:
        \"\"\"Multiply two integers.\"\"\"
        return a * b

    class Calculator(ToolEnvironment):
        tools = [mul]

        def reward(self, answer, row):
            return float(answer.strip() == str(row["ground_truth"]))
"""

from rlctl.agents.env import Environment, Row, Step, ToolEnvironment, Turn, parse_turn
from rlctl.agents.loader import load_environment
from rlctl.agents.render import ObservationRenderer
from rlctl.agents.rollout import run_episodes
from rlctl.agents.tools import Tool, ToolCall, as_tool, function_schema, parse_tool_calls, run_tool_call

__all__ = [
    "Environment",
    "ObservationRenderer",
    "Row",
    "Step",
    "Tool",
    "ToolCall",
    "ToolEnvironment",
    "Turn",
    "as_tool",
    "function_schema",
    "load_environment",
    "parse_tool_calls",
    "parse_turn",
    "run_episodes",
    "run_tool_call",
]
