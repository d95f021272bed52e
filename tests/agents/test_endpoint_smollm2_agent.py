"""The SmolLM2 example agent (profiles/agent/guess_openai_smollm2_agent.py) wins games on
SmolLM2-135M-Instruct before any training, more than the tiny model's agent (a bare digit in 4
tokens) wins of the same games: where no game is won every GRPO group's rewards are equal and
nothing is learned.

Both agents play the same rows through the endpoint with the same seed; runs with -m slow."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from rlctl.data.batcher import left_pad
from rlctl.data.dataset import encode_prompt
from rlctl.data.tasks.guess import GuessTask
from rlctl.engines.hf_rollout import HFRolloutEngine

pytestmark = pytest.mark.slow  # a real 135M model on CPU: about 3 minutes on a shared 2-core host
pytest.importorskip(
    "openai", reason="the endpoint's client is the openai package: pip install 'rlctl[agent]'"
)
AGENTS = Path(__file__).resolve().parents[2] / "profiles/agent"
ROWS, TURNS = 12, 3


def _agent(name: str):
    spec = importlib.util.spec_from_file_location(name, AGENTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def smol(smollm2_dir):
    import torch
    from transformers import AutoTokenizer

    torch.set_num_threads(2)
    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    rows = [
        {
            "prompt": r["prompt"],
            "ground_truth": r["reward_model"]["ground_truth"],
            "extra_info": r["extra_info"],
        }
        for r in GuessTask(style="question").rows("validation", ROWS, seed=0)
    ]
    ids, mask, _ = left_pad([encode_prompt(tok, r["prompt"]) for r in rows], tok.pad_token_id)
    return tok, rows, ids, mask, HFRolloutEngine(smollm2_dir)


def _play(smol, agent, budget: int, turn_tokens: int):
    from rlctl.agents.endpoint import EndpointRollout

    tok, rows, ids, mask, engine = smol
    return EndpointRollout(
        engine.generate,
        tok,
        agent,
        rows,
        ids,
        mask,
        max_turns=[TURNS] * len(rows),
        max_tokens=budget,
        max_turn_tokens=turn_tokens,
        eos_token_id=[tok.eos_token_id],
        pad_token_id=tok.pad_token_id,
        seed=11,
        sampling={"temperature": 0.7},
    ).run()


def test_the_smollm2_agent_wins_more_games_than_the_tiny_models_agent_before_training(smol):
    tiny = _play(smol, _agent("guess_openai_agent").run, budget=40, turn_tokens=4)
    served = _play(smol, _agent("guess_openai_smollm2_agent").run, budget=160, turn_tokens=8)
    wins, tiny_wins = served["agent_reward"].sum().item(), tiny["agent_reward"].sum().item()
    assert wins > tiny_wins, (served["agent_reward"].tolist(), tiny["agent_reward"].tolist())
    assert served["agent_reward"].min() < 1  # not every game won: GRPO groups differ
    assert served["agent_errors"].sum() == 0 and served["agent_prefix_mismatch"].sum() == 0
    # the example game the agent puts first is context (mask 0), never trained
    assert (served["response_mask"].sum(dim=1) <= TURNS * 9).all()
