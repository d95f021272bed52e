"""The OpenAI-compatible endpoint: unmodified OpenAI-client agent code plays episodes on the rollout
engine, and the trainer gets exactly the tokens, mask and log-probs the native environment gives
for the same sampled tokens."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from rlctl.agents import run_episodes
from rlctl.agents.builtin import GuessEnv
from rlctl.agents.endpoint import EndpointRollout
from rlctl.data.batcher import left_pad
from rlctl.data.dataset import encode_prompt
from rlctl.data.tasks.guess import GuessTask
from rlctl.engines.hf_rollout import HFRolloutEngine

openai = pytest.importorskip(
    "openai", reason="the endpoint's client is the openai package: pip install 'rlctl[agent]'"
)
torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[2]
GUESS_SFT = ROOT / "profiles/assets/tiny-1m-guess-sft"
AGENT_FILE = ROOT / "profiles/agent/guess_openai_agent.py"


def load_example_agent():
    spec = importlib.util.spec_from_file_location("guess_openai_agent", AGENT_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.run


@pytest.fixture(scope="module")
def guess_setup():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(GUESS_SFT))
    rows = [
        {
            "prompt": r["prompt"],
            "ground_truth": r["reward_model"]["ground_truth"],
            "extra_info": r["extra_info"],
        }
        for r in GuessTask().rows("validation", 24, seed=0)
    ]
    ids, mask, _ = left_pad([encode_prompt(tok, r["prompt"]) for r in rows], tok.pad_token_id)
    return tok, rows, ids, mask, HFRolloutEngine(GUESS_SFT)


def _endpoint(engine, tok, agent, rows, ids, mask, *, seed=5, gather_s=None, **sampling):
    return EndpointRollout(
        engine.generate,
        tok,
        agent,
        rows,
        ids,
        mask,
        max_turns=[3] * len(rows),
        max_tokens=32,
        max_turn_tokens=4,
        eos_token_id=[tok.eos_token_id],
        pad_token_id=tok.pad_token_id,
        seed=seed,
        sampling={"temperature": 1.0, **sampling},
        gather_s=gather_s,
    )


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
    run = _endpoint(engine, tok, load_example_agent(), rows, ids, mask)
    served = run.run()
    assert native["agent_turns"].sum() > len(rows)  # several episodes went past one turn
    for key in ("prompts", "responses", "response_mask", "attention_mask", "input_ids"):
        assert torch.equal(served[key], native[key]), key
    assert torch.allclose(served["rollout_log_probs"], native["rollout_log_probs"], atol=1e-5)
    assert torch.equal(served["agent_reward"], native["agent_reward"])
    assert torch.equal(served["agent_turns"], native["agent_turns"])
    assert served["agent_prefix_mismatch"].sum() == 0
    assert run.batcher.batches == int(native["agent_turns"].max())  # one engine call per turn
