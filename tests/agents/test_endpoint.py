"""The OpenAI-compatible endpoint: unmodified OpenAI-client agent code plays episodes on the rollout
engine, and the trainer gets exactly the tokens, mask and log-probs the native environment gives
for the same sampled tokens."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlctl.agents import run_episodes
from rlctl.agents.builtin import GuessEnv
from tests.agents.helpers import endpoint_rollout, guess_games, load_agent

openai = pytest.importorskip(
    "openai", reason="the endpoint's client is the openai package: pip install 'rlctl[agent]'"
)
torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[2]
GUESS_SFT = ROOT / "profiles/assets/tiny-1m-guess-sft"


@pytest.fixture(scope="module")
def guess_setup():
    return guess_games(GUESS_SFT, 24)




def test_example_agent_equals_the_native_environment_token_for_token(guess_setup):
    tok, rows, ids, mask, engine = guess_setup
    native, _ = run_episodes(
        engine.generate,
        tok,
        [GuessEnv() for _ in rows],
        rows,
        ids,
        mask,
        max_turns=3,
        max_tokens=32,
        max_turn_tokens=4,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        seed=5,
        temperature=1.0,
    )
    agent = load_agent("guess_openai_agent").run
    run = endpoint_rollout(
        guess_setup, agent, turns=3, budget=32, turn_tokens=4, seed=5, sampling={"temperature": 1.0}
    )
    served = run.run()
    assert native["agent_turns"].sum() > len(rows)  # several episodes went past one turn
    for key in ("prompts", "responses", "response_mask", "attention_mask", "input_ids"):
        assert torch.equal(served[key], native[key]), key
    assert torch.allclose(served["rollout_log_probs"], native["rollout_log_probs"], atol=1e-5)
    assert torch.equal(served["agent_reward"], native["agent_reward"])
    assert torch.equal(served["agent_turns"], native["agent_turns"])
    assert served["agent_prefix_mismatch"].sum() == 0
    assert run.batcher.batches == int(native["agent_turns"].max())  # one engine call per turn
