"""SmolLM2-135M-Instruct through the endpoint: its real chat template (a default system prompt,
ChatML turns, ``<|im_end|>`` as EOS) re-renders every request, and the trajectory is still token
for token what the native rollout builds for the same samples: ids, loss mask and log-probs.

Answers are cut at 4 tokens, so most turns end without EOS (the template's end of turn then opens
the next request's context) and some end with it: both splices are exercised. The tiny model's
tests (test_endpoint.py) cover the same rule fast; these run with -m slow."""

from __future__ import annotations

import pytest
import torch

from rlctl.agents import run_episodes
from rlctl.agents.env import Environment, Step, Turn
from tests.agents.helpers import endpoint_rollout, guess_games, load_agent

pytestmark = pytest.mark.slow  # a real 135M model on CPU: 30-110 s a test on a shared 2-core host
openai = pytest.importorskip(
    "openai", reason="the endpoint's client is the openai package: pip install 'rlctl[agent]'"
)
torch.set_num_threads(2)
TURNS, TURN_TOKENS, BUDGET = 3, 4, 40


class AlwaysLower(Environment):
    """Answers every model turn with ``lower`` until ``TURNS`` turns are played."""

    def step(self, turn: Turn) -> Step:
        if turn.index + 1 >= TURNS:
            return Step(done=True, reward=0.0)
        return Step(messages=[{"role": "user", "content": "lower"}])


async def always_lower(client, row):
    """The same game, played through the OpenAI client whatever the model writes."""
    messages = [dict(m) for m in row["prompt"]]
    for _ in range(TURNS):
        reply = await client.chat.completions.create(model="policy", messages=messages, max_tokens=TURN_TOKENS)
        messages.append({"role": "assistant", "content": reply.choices[0].message.content or ""})
        messages.append({"role": "user", "content": "lower"})
    return 0.0


@pytest.fixture(scope="module")
def smol(smollm2_dir):
    return guess_games(smollm2_dir, 6, style="question")


def _served(smol, agent):
    run = endpoint_rollout(
        smol, agent, turns=TURNS, budget=BUDGET, turn_tokens=TURN_TOKENS, seed=11, sampling={"temperature": 0.7}
    )
    return run, run.run()


def _native(smol, env):
    tok, rows, ids, mask, engine = smol
    batch, _ = run_episodes(
        engine.generate,
        tok,
        [env() for _ in rows],
        rows,
        ids,
        mask,
        max_turns=TURNS,
        max_tokens=BUDGET,
        max_turn_tokens=TURN_TOKENS,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        seed=11,
        temperature=0.7,
    )
    return batch


def _assert_same_tokens(served, native):
    for key in ("prompts", "responses", "response_mask", "attention_mask", "input_ids"):
        assert torch.equal(served[key], native[key]), key
    assert torch.allclose(served["rollout_log_probs"], native["rollout_log_probs"], atol=1e-5)
    assert served["agent_prefix_mismatch"].sum() == 0 and served["agent_errors"].sum() == 0


def test_smollm2_multi_turn_trajectories_are_token_exact(smol):
    run, served = _served(smol, always_lower)
    native = _native(smol, AlwaysLower)
    assert served["agent_turns"].tolist() == [float(TURNS)] * len(smol[1])
    _assert_same_tokens(served, native)
    assert run.batcher.batches == TURNS  # the six episodes' requests batched, one engine call a turn


def test_the_example_agent_on_smollm2_equals_the_native_environment(smol):
    from rlctl.agents.builtin import GuessEnv

    _, served = _served(smol, load_agent("guess_openai_agent").run)
    native = _native(smol, GuessEnv)
    _assert_same_tokens(served, native)
    assert torch.equal(served["agent_reward"], native["agent_reward"])
