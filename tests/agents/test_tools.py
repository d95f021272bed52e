"""Tools, Hermes tool-call parsing, per-sample tool errors, and loading an environment file."""

from __future__ import annotations

import pytest

from rlctl.agents import (
    ToolCall,
    ToolEnvironment,
    function_schema,
    parse_tool_calls,
    parse_turn,
    run_tool_call,
)
from rlctl.agents.builtin import CalculatorEnv
from rlctl.agents.loader import load_environment, turns_for_row
from rlctl.agents.tools import tool_registry
from rlctl.errors import UserError


def add(a: int, b: float = 1.0, *, secret: str = "") -> str:
    """Add two numbers.

    Longer text that is not the description.
    """
    return f"{a + b}{secret}"


def test_schema_is_openai_function_calling_from_the_signature():
    assert function_schema(add) == {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two numbers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "number"}},
                "required": ["a"],
            },
        },
    }


def test_hermes_calls_are_parsed_and_malformed_ones_are_errors():
    text = (
        'ok <tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>'
        '<tool_call>{"name": "add", "arguments": "{\\"a\\": 2}"}</tool_call>'
        "<tool_call>{not json}</tool_call>"
        '<tool_call>{"arguments": {}}</tool_call>'
        '<tool_call>{"name": "add", "arguments": [1]}</tool_call> tail <tool_call>{"name"'
    )
    rest, calls, errors = parse_tool_calls(text)
    assert calls == [ToolCall("add", {"a": 1}), ToolCall("add", {"a": 2})]
    assert len(errors) == 4
    assert "not valid JSON" in errors[0] and "'name'" in errors[1] and "'arguments'" in errors[2]
    assert "unterminated" in errors[3]
    assert rest.startswith("ok ") and "tail" in rest


def test_tool_call_errors_name_what_went_wrong():
    tools = tool_registry([add])
    assert run_tool_call(ToolCall("add", {"a": 2, "b": 0.5}), tools) == ("2.5", None)
    assert "unknown tool 'sub'" in run_tool_call(ToolCall("sub", {}), tools)[1]
    assert "missing a" in run_tool_call(ToolCall("add", {}), tools)[1]
    assert "unexpected secret" in run_tool_call(ToolCall("add", {"a": 1, "secret": "x"}), tools)[1]
    assert "raised TypeError" in run_tool_call(ToolCall("add", {"a": "x"}), tools)[1]
    # verl's tools_kwargs fill keyword-only parameters, which the model never sees
    kwargs = {"add": {"create_kwargs": {"secret": "!"}}}
    assert run_tool_call(ToolCall("add", {"a": 1}), tools, kwargs) == ("2.0!", None)


def test_tool_environment_counts_errors_per_sample_and_answers_at_the_end():
    env = CalculatorEnv()
    env.start({"ground_truth": "6", "tools_kwargs": {}})
    call = '<tool_call>{"name":"mul","arguments":{"a":2,"b":3}}</tool_call>'
    step = env.step(parse_turn(call + '<tool_call>{"name":"mul","arguments":{"a":2}}</tool_call>', 0))
    assert not step.done and step.tool_calls == 2 and step.tool_errors == 1
    assert [m["content"] for m in step.messages] == ["6", "error: tool 'mul': bad arguments (missing b)"]
    assert env.step(parse_turn("<tool_call>{bad", 1)).tool_errors == 1
    assert env.step(parse_turn(" 6 ", 2)).reward == 1.0
    assert env.step(parse_turn("7", 2)).reward == 0.0

    class Strict(CalculatorEnv):
        stop_on_tool_error = True
        tool_error_reward = -1.0

    strict = Strict()
    strict.start({"ground_truth": "6", "tools_kwargs": {}})
    step = strict.step(parse_turn("<tool_call>[]</tool_call>", 0))
    assert step.done and step.reward == -1.0 and step.tool_errors == 1


ENV_FILE = '''
from rlctl.agents import ToolEnvironment

def mul(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b

class Calculator(ToolEnvironment):
    tools = [mul]

    def reward(self, answer, row):
        return float(answer.strip() == str(row["ground_truth"]))
'''


def test_environment_file_loads_like_a_custom_reward(tmp_path):
    (tmp_path / "env.py").write_text(ENV_FILE)
    factory = load_environment("env.py:Calculator", tmp_path)
    env = factory()
    assert isinstance(env, ToolEnvironment)
    assert load_environment("builtin:calculator") is CalculatorEnv
    with pytest.raises(UserError, match="not found in"):
        load_environment("env.py:Nope", tmp_path)
    with pytest.raises(UserError, match="file not found"):
        load_environment("missing.py:Calculator", tmp_path)
    with pytest.raises(UserError, match="expected 'builtin:NAME'"):
        load_environment("env.py", tmp_path)
    (tmp_path / "broken.py").write_text("raise ValueError('boom')\n")
    with pytest.raises(UserError, match="failed to import: ValueError: boom"):
        load_environment("broken.py:X", tmp_path)


def test_verl_agent_names_pick_the_turn_limit():
    assert turns_for_row({}, "calculator", 4) == 4
    assert turns_for_row({"agent_name": "tool_agent"}, "calculator", 4) == 4
    assert turns_for_row({"agent_name": "single_turn_agent"}, "calculator", 4) == 1
    with pytest.raises(UserError, match="react_agent"):
        turns_for_row({"agent_name": "react_agent"}, "calculator", 4)


def test_python_tool_runs_code_in_the_sandbox():
    from rlctl.agents.builtin import python_tool
    from rlctl.rewards.sandbox import SandboxLimits

    tools = tool_registry([python_tool(SandboxLimits(level="best-effort", timeout_s=10))])
    assert tools["python"].schema["function"]["parameters"]["required"] == ["code"]
    assert run_tool_call(ToolCall("python", {"code": "print(6 * 7)"}), tools) == ("42\n", None)
    _, error = run_tool_call(ToolCall("python", {"code": "raise SystemExit(3)"}), tools)
    assert "tool 'python' raised RuntimeError: exit 3" in error


def test_a_tool_call_nested_too_deeply_is_an_invalid_call_not_a_crash():
    deep = "[" * 100_000 + "]" * 100_000
    text = f'<tool_call>{{"name": "add", "arguments": {deep}}}</tool_call>'
    text += f'<tool_call>{{"name": "add", "arguments": "{deep}"}}</tool_call>'
    _, calls, errors = parse_tool_calls(text)
    assert calls == [] and len(errors) == 2
    assert "nested too deeply" in errors[0] and "'arguments' must be a JSON object" in errors[1]
    env = CalculatorEnv()
    env.start({"ground_truth": "6", "tools_kwargs": {}})
    step = env.step(parse_turn(f'<tool_call>{{"name": "mul", "arguments": {deep}}}</tool_call>', 0))
    assert not step.done and step.tool_calls == 1 and step.tool_errors == 1  # agent/tool_errors counts it
    assert step.messages[0]["content"].startswith("error: tool call JSON is nested too deeply")
