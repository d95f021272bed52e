"""`rlctl check-template`: the tiny model's and SmolLM2's templates splice exactly; a template that
drops the turn separator is flagged, and a run on it is refused before any worker starts."""

from __future__ import annotations

import json

from rlctl.models.tokenizer import CHAT_TEMPLATE
from tests.agents.helpers import make_char_model
from tests.cli_runner import run_cli

# the tiny template with the end-of-turn token dropped between turns (kept only on the last message)
DROPPED_SEPARATOR = CHAT_TEMPLATE.replace(
    "{% if m['role'] == 'assistant' %}{{ '<|eos|>' }}{% endif %}",
    "{% if m['role'] == 'assistant' and loop.last %}{{ '<|eos|>' }}{% endif %}",
)


def test_the_tiny_template_splices_exactly(char_model):
    code, out, err = run_cli("check-template", str(char_model), "--json")
    assert code == 0, err
    verdict = json.loads(out)
    assert verdict["ok"] and verdict["stop_text"] == "<|eos|>" and verdict["tool_role"] is False
    assert verdict["checked"] == ["plain turns", "system prompt", "tool round trip"]


def test_a_template_that_strips_earlier_reasoning_is_reported(think_model, char_model):
    # Qwen3-like: the generation prompt opens an empty think block that re-rendered turns drop, so
    # even plain turns do not splice; the reasoning row says why a thinking model would split too
    code, out, _ = run_cli("check-template", str(think_model), "--json")
    verdict = json.loads(out)
    assert code == 1 and verdict["reasoning_kept"] is False and not verdict["checked"]
    _, out, _ = run_cli("check-template", str(think_model))
    assert "reasoning blocks: stripped from earlier turns" in out
    assert "the next request renders '7<|eos|>" in out and "holds '<think></think>7<|eos|>'" in out
    _, out, _ = run_cli("check-template", str(char_model), "--json")
    assert json.loads(out)["reasoning_kept"] is True


def test_smollm2_template_splices_exactly(smollm2_dir):
    code, out, err = run_cli("check-template", smollm2_dir)
    assert code == 0, out + err
    assert "ok: splices exactly" in out and out.count("PASS") == 3


def test_a_dropped_separator_is_flagged(tmp_path):
    assert DROPPED_SEPARATOR != CHAT_TEMPLATE
    model = make_char_model(tmp_path / "dropped", DROPPED_SEPARATOR)
    code, out, _ = run_cli("check-template", str(model))
    assert code == 1
    assert "FAIL  plain turns, assistant turn 1" in out and "<|eos|>" in out
    assert "not splice-exact" in out


PROFILE = """
[run]
name = "refused"
output_dir = "{out}"
[platform]
vendor = "cpu"
[cluster]
backend = "inprocess"
[model]
path = "{model}"
[data]
train = "builtin:guess"
val_size = 4
[rollout]
engine = "hf"
n = 2
max_new_tokens = 16
[agent]
openai_agent = "{agent}"
[trainer]
steps = 1
prompts_per_step = 2
"""


def test_a_run_on_such_a_template_is_refused_before_workers_start(tmp_path):
    from pathlib import Path

    agent = Path(__file__).resolve().parents[2] / "profiles/agent/guess_openai_agent.py"
    model = make_char_model(tmp_path / "dropped", DROPPED_SEPARATOR)
    profile = tmp_path / "p.toml"
    profile.write_text(PROFILE.format(out=tmp_path / "runs", model=model, agent=agent))
    code, out, err = run_cli("--log-format", "plain", "train", str(profile))
    assert code == 2, out + err
    assert "agent.openai_agent" in err and "cannot be spliced" in err and "assistant turn 1" in err
    assert "starting workers" not in out + err
