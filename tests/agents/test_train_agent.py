"""A user-defined environment file trains through the CLI: `rlctl train` with agent.env set."""

from __future__ import annotations

import json
from pathlib import Path

from rlctl.data.tasks.calculator import CalculatorTask
from tests.agents.test_tools import ENV_FILE
from tests.cli_runner import run_cli

# the README's environment plus one that always takes two turns (a random model calls no tool)
TWO_TURNS = """

from rlctl.agents import Environment, Step


class TwoTurns(Environment):
    def step(self, turn):
        if turn.index == 0:
            return Step(messages=[{"role": "tool", "content": "again"}], tool_calls=1)
        return Step(done=True, reward=float(sum(c.isdigit() for c in turn.text)))
"""

PROFILE = """
[run]
name = "agent"
seed = 1
output_dir = "{out}"
[platform]
vendor = "cpu"
[cluster]
backend = "inprocess"
[model]
path = "{model}"
[data]
train = "train.jsonl"
val = "val.jsonl"
max_prompt_length = 32
[algorithm]
preset = "grpo"
[actor]
lr = 1e-4
micro_batch_sequences = 16
[rollout]
engine = "hf"
n = 2
max_new_tokens = 40
[agent]
env = "env.py:TwoTurns"
max_turns = 2
max_turn_tokens = 8
[trainer]
steps = 2
prompts_per_step = 2
val_every = 2
val_at_start = false
save_every = 0
export_hf = false
loggers = ["jsonl"]
"""


def write_rows(path: Path, split: str, n: int) -> None:
    rows = CalculatorTask().rows(split, n, seed=0)
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")


def test_user_environment_file_trains_through_the_cli(tmp_path, char_model):
    (tmp_path / "env.py").write_text(ENV_FILE + TWO_TURNS)
    write_rows(tmp_path / "train.jsonl", "train", 8)
    write_rows(tmp_path / "val.jsonl", "validation", 2)
    profile = tmp_path / "agent.toml"
    profile.write_text(PROFILE.format(out=tmp_path / "runs", model=char_model))
    code, _, err = run_cli("train", str(profile))
    assert code == 0, err
    lines = [json.loads(x) for x in (tmp_path / "runs/agent/metrics.jsonl").read_text().splitlines()]
    steps = [x for x in lines if "agent/turns_mean" in x]
    assert len(steps) == 2
    for m in steps:
        assert m["agent/turns_mean"] == 2.0 and m["agent/tool_calls_mean"] == 1.0
        assert {"agent/tool_calls_mean", "agent/tool_errors_mean", "agent/success"} <= set(m)
    assert "val/agent_success" in lines[-1]
