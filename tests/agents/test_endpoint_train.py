"""`rlctl train` with agent.openai_agent: the agent file trains through the CLI on the endpoint, and
bad settings are refused with one line before any worker starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli_runner import run_cli

ROOT = Path(__file__).resolve().parents[2]
AGENT = ROOT / "profiles/agent/guess_openai_agent.py"
PROFILE = """
[run]
name = "openai-agent"
seed = 1
output_dir = "{out}"
[platform]
vendor = "cpu"
[cluster]
backend = "inprocess"
[model]
path = "{model}"
[data]
train = "builtin:guess"
val_size = 8
[algorithm]
preset = "grpo"
[actor]
lr = 1e-3
use_kl_loss = false
micro_batch_sequences = 16
[rollout]
engine = "hf"
n = 4
max_new_tokens = 32
[agent]
{agent}
max_turns = 3
max_turn_tokens = 4
[trainer]
steps = 2
prompts_per_step = 4
val_every = 2
val_at_start = false
save_every = 0
export_hf = false
loggers = ["jsonl"]
"""


def _profile(tmp_path: Path, agent: str) -> Path:
    p = tmp_path / "p.toml"
    p.write_text(
        PROFILE.format(out=tmp_path / "runs", model=ROOT / "profiles/assets/tiny-1m-guess-sft", agent=agent)
    )
    return p


def test_the_example_agent_trains_through_the_cli(tmp_path):
    pytest.importorskip(
        "openai", reason="the endpoint's client is the openai package: pip install 'rlctl[agent]'"
    )
    code, out, err = run_cli("train", str(_profile(tmp_path, f'openai_agent = "{AGENT}"')))
    assert code == 0, out + err
    lines = [json.loads(x) for x in (tmp_path / "runs/openai-agent/metrics.jsonl").read_text().splitlines()]
    steps = [x for x in lines if "agent/turns_mean" in x]
    assert len(steps) == 2
    for m in steps:
        assert m["agent/turns_mean"] >= 1 and m["agent/prefix_mismatch"] == 0 and m["agent/errors"] == 0
        assert m["actor/grad_norm"] > 0  # the sampled tokens reached the loss
    assert any("val/agent_success" in x for x in lines)


ANSWERING_AGENT = """
async def run(client, row):
    messages = [dict(m) for m in row["prompt"]]
    text = ""
    for _ in range(3):
        reply = await client.chat.completions.create(model="policy", messages=messages, max_tokens=4)
        text = reply.choices[0].message.content or ""
        if not text.strip().isdigit() or int(text) == int(row["ground_truth"]):
            break
        messages.append({"role": "assistant", "content": text})
        messages.append({"role": "user", "content": "higher" if int(text) < int(row["ground_truth"]) else "lower"})
    return text, 0.5
"""


def test_an_agent_returning_its_answer_trains_with_the_profile_reward(tmp_path):
    """The agent returns (final answer, 0.5) under agent.reward = 'sum': [reward] (exact) scores the
    answer against the secret and the 0.5 is added; success is the exact match alone."""
    pytest.importorskip("openai", reason="the endpoint's client is the openai package")
    (tmp_path / "answering.py").write_text(ANSWERING_AGENT)
    profile = _profile(tmp_path, 'openai_agent = "answering.py"\nreward = "sum"')
    profile.write_text(profile.read_text() + '[reward]\nkind = "exact"\n')
    code, out, err = run_cli("train", str(profile))
    assert code == 0, out + err
    lines = [json.loads(x) for x in (tmp_path / "runs/openai-agent/metrics.jsonl").read_text().splitlines()]
    steps = [x for x in lines if "agent/turns_mean" in x]
    assert len(steps) == 2 and all(m["agent/errors"] == 0 and m["actor/grad_norm"] > 0 for m in steps)
    for m in steps:  # every score is the exact match (0 or 1) plus the agent's 0.5
        assert m["reward/score_mean"] == pytest.approx(m["reward/accuracy"] + 0.5), m
        assert m["agent/success"] == pytest.approx(m["reward/accuracy"])
    val = [x for x in lines if "val/agent_success" in x]
    assert val and val[-1]["val/score_mean"] == pytest.approx(val[-1]["val/accuracy"] + 0.5)


@pytest.mark.parametrize(
    ("agent", "message"),
    [
        ('env = "builtin:guess"\nreward = "sum"', "agent.reward: 'sum' reads an agent.openai_agent's"),
        ('openai_agent = "a.py"\nreward = "both"', "agent.reward"),
        ('env = "builtin:guess"\nopenai_agent = "a.py"', "set together with agent.env"),
        ('openai_agent = "missing.py:run"', "agent.openai_agent: file not found"),
        ('openai_agent = "sync_agent.py"', "must be 'async def run(client, row)'"),
    ],
)
def test_bad_agent_settings_are_one_line_errors(tmp_path, agent, message):
    (tmp_path / "sync_agent.py").write_text("def run(client, row):\n    return 1.0\n")
    code, out, err = run_cli("--log-format", "plain", "train", str(_profile(tmp_path, agent)))
    assert code == 2, out + err
    assert message in err and "Traceback" not in err
    assert "starting workers" not in out + err
