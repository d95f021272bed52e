"""The SmolLM2 example agent (profiles/agent/guess_openai_smollm2_agent.py) wins games on
SmolLM2-135M-Instruct before any training, more than the tiny model's agent (a bare digit in 4
tokens) wins of the same games: where no game is won every GRPO group's rewards are equal and
nothing is learned.

Both agents play the same rows through the endpoint with the same seed; runs with -m slow."""

from __future__ import annotations

import pytest

from tests.agents.helpers import endpoint_rollout, guess_games, load_agent

pytestmark = pytest.mark.slow  # a real 135M model on CPU: about 3 minutes on a shared 2-core host
pytest.importorskip(
    "openai", reason="the endpoint's client is the openai package: pip install 'rlctl[agent]'"
)
ROWS, TURNS = 12, 3


@pytest.fixture(scope="module")
def smol(smollm2_dir):
    import torch

    torch.set_num_threads(2)
    return guess_games(smollm2_dir, ROWS, style="question")


def _play(smol, agent, budget: int, turn_tokens: int):
    run = endpoint_rollout(
        smol, agent, turns=TURNS, budget=budget, turn_tokens=turn_tokens, seed=11, sampling={"temperature": 0.7}
    )
    return run.run()


def test_the_smollm2_agent_wins_more_games_than_the_tiny_models_agent_before_training(smol):
    tiny = _play(smol, load_agent("guess_openai_agent").run, budget=40, turn_tokens=4)
    served = _play(smol, load_agent("guess_openai_smollm2_agent").run, budget=160, turn_tokens=8)
    wins, tiny_wins = served["agent_reward"].sum().item(), tiny["agent_reward"].sum().item()
    assert wins > tiny_wins, (served["agent_reward"].tolist(), tiny["agent_reward"].tolist())
    assert served["agent_reward"].min() < 1  # not every game won: GRPO groups differ
    assert served["agent_errors"].sum() == 0 and served["agent_prefix_mismatch"].sum() == 0
    # the example game the agent puts first is context (mask 0), never trained
    assert (served["response_mask"].sum(dim=1) <= TURNS * 9).all()
