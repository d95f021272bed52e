"""agent.reward: an OpenAI-client agent's returned string is its final answer, scored by the
profile's [reward] against the row's ground truth; 'sum' adds the agent's number to that score;
anything else an agent returns fails its episode, named."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from rlctl.agents.driver import score_episodes
from rlctl.agents.outcome import Outcome, read_outcome
from rlctl.data.batcher import left_pad
from rlctl.data.dataset import encode_prompt
from rlctl.data.tasks.guess import GuessTask
from rlctl.dispatch import DataProto
from rlctl.engines.hf_rollout import HFRolloutEngine
from rlctl.rewards.manager import build_reward_manager
from rlctl.trainer.step.scoring import BatchScorer

ROOT = Path(__file__).resolve().parents[2]
GUESS_SFT = ROOT / "profiles/assets/tiny-1m-guess-sft"
torch.set_num_threads(1)


@pytest.mark.parametrize(
    ("value", "mode", "expected"),
    [
        (1, "agent", Outcome(reward=1.0)),
        (True, "agent", Outcome(reward=1.0)),
        (None, "agent", Outcome()),
        ("42", "agent", Outcome(answer="42")),
        ("", "sum", Outcome(answer="")),
        (("42", 0.25), "sum", Outcome(reward=0.25, answer="42")),
        (-0.5, "sum", Outcome(reward=-0.5)),
    ],
)
def test_return_values_read(value, mode, expected):
    assert read_outcome(value, mode) == expected


@pytest.mark.parametrize(
    ("value", "mode", "message"),
    [
        (("42", 1.0), "agent", "agent.reward = 'sum'"),
        ((1.0, "42"), "sum", "expected (answer: str, reward: number)"),
        ({"c1": 1.0}, "agent", "returned dict; expected a number, a bool, a string"),
        (math.nan, "agent", "expected a finite number"),
        (("42", "x"), "sum", "the pair's reward is str"),
    ],
)
def test_unreadable_return_values_fail_the_episode_named(value, mode, message):
    with pytest.raises((TypeError, ValueError), match=message.replace("(", r"\(").replace(")", r"\)")):
        read_outcome(value, mode)


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(str(GUESS_SFT))


def _scorer(tok) -> BatchScorer:
    return BatchScorer(tok, build_reward_manager(kind="exact"), max_new_tokens=8)


def _batch(tok, rewards, answered, answers, errors=None) -> DataProto:
    n = len(rewards)
    responses = torch.tensor([tok("7", add_special_tokens=False)["input_ids"][:1] * 2] * n)
    return DataProto.from_dict(
        tensors={
            "responses": responses,
            "response_mask": torch.ones_like(responses),
            "agent_reward": torch.tensor(rewards, dtype=torch.float32),
            "agent_success": torch.tensor([float(r > 0) for r in rewards]),
            "agent_answered": torch.tensor(answered, dtype=torch.float32),
            "agent_errors": torch.tensor(errors or [0.0] * n),
        },
        non_tensors={
            "data_source": ["guess"] * n,
            "ground_truth": ["42"] * n,
            "extra_info": [{}] * n,
            "agent_answer": answers,
        },
    )


def test_a_returned_answer_is_scored_instead_of_the_model_tokens(tok):
    nan = math.nan  # the model's decoded tokens are "77": an exact match of "42" fails on them
    batch = _batch(tok, [nan, nan, nan, 0.5], [1.0, 1.0, 0.0, 0.0], ["42", " 41 ", "", ""])
    out, _ = score_episodes(batch, _scorer(tok))
    assert out.batch["scores"].tolist() == [1.0, 0.0, 0.0, 0.5]
    assert out.batch["acc"].tolist() == [1.0, 0.0, 0.0, 1.0]
    assert out.batch["token_level_scores"][0, -1].item() == 1.0


def test_sum_adds_the_agent_number_to_the_profile_score(tok):
    nan = math.nan
    batch = _batch(
        tok, [0.25, nan, -0.5, 0.0], [1.0, 1.0, 0.0, 1.0], ["42", "42", "", "42"], errors=[0, 0, 0, 1.0]
    )
    out, _ = score_episodes(batch, _scorer(tok), reward_mode="sum")
    assert out.batch["scores"].tolist() == [1.25, 1.0, -0.5, 0.0]  # the failed agent's episode scores 0
    assert out.batch["acc"].tolist() == [1.0, 1.0, 0.0, 0.0]  # success is the profile's, not the bonus
    same, _ = score_episodes(batch, _scorer(tok))  # 'agent': a given number is the reward, unscored
    assert same.batch["scores"].tolist() == [0.25, 1.0, -0.5, 0.0]


def _guess_rows(tok, n=8):
    rows = [
        {"prompt": r["prompt"], "ground_truth": r["reward_model"]["ground_truth"], "extra_info": r["extra_info"]}
        for r in GuessTask().rows("validation", n, seed=0)
    ]
    ids, mask, _ = left_pad([encode_prompt(tok, r["prompt"]) for r in rows], tok.pad_token_id)
    return rows, ids, mask


async def last_guess(client, row):
    """Plays one turn and returns the model's answer text: the episode's final answer."""
    messages = [dict(m) for m in row["prompt"]]
    reply = await client.chat.completions.create(model="policy", messages=messages, max_tokens=4)
    return reply.choices[0].message.content


async def bonus_pair(client, row):
    text = await last_guess(client, row)
    return text, 0.5


@pytest.mark.parametrize(("agent", "mode"), [(last_guess, "agent"), (bonus_pair, "sum")])
def test_endpoint_episodes_carry_the_returned_answer(tok, agent, mode):
    pytest.importorskip("openai", reason="the endpoint's client is the openai package")
    from rlctl.agents.endpoint import EndpointRollout

    rows, ids, mask = _guess_rows(tok)
    run = EndpointRollout(
        HFRolloutEngine(GUESS_SFT).generate,
        tok,
        agent,
        rows,
        ids,
        mask,
        max_turns=[1] * len(rows),
        max_tokens=8,
        max_turn_tokens=4,
        eos_token_id=[tok.eos_token_id],
        pad_token_id=tok.pad_token_id,
        seed=3,
        sampling={"greedy": True},
        reward_mode=mode,
    )
    t = run.run()
    answers = run.answers()
    assert t["agent_answered"].tolist() == [1.0] * len(rows) and t["agent_errors"].sum() == 0
    decoded = [
        tok.decode(r[m.bool()].tolist(), skip_special_tokens=True)
        for r, m in zip(t["responses"], t["response_mask"], strict=True)
    ]
    assert [a.strip() for a in answers] == [d.strip() for d in decoded]  # the content the model wrote
    batch = DataProto.from_dict(
        tensors=t,
        non_tensors={
            "data_source": ["guess"] * len(rows),
            "ground_truth": [r["ground_truth"] for r in rows],
            "extra_info": [{}] * len(rows),
            "agent_answer": answers,
        },
    )
    out, _ = score_episodes(batch, _scorer(tok), reward_mode=mode)
    hits = [float(a.strip() == str(r["ground_truth"])) for a, r in zip(answers, rows, strict=True)]
    bonus = 0.5 if mode == "sum" else 0.0
    assert out.batch["acc"].tolist() == hits
    assert out.batch["scores"].tolist() == [h + bonus for h in hits]


ORACLE = '''
async def run(client, row):
    await client.chat.completions.create(model="policy", messages=row["prompt"], max_tokens=4)
    return str(row["ground_truth"])
'''


def test_eval_scores_a_returned_answer_with_the_profile_reward(tmp_path, tok):
    """`rlctl eval` / SFT validation: an agent's returned answer is scored by [reward] there too."""
    pytest.importorskip("openai", reason="the endpoint's client is the openai package")
    from rlctl.agents.evaluate import episode_accuracy
    from rlctl.data.batcher import PromptBatcher
    from rlctl.data.dataset import PromptDataset
    from rlctl.profile import load_profile
    from rlctl.trainer.setup.evaluate import scorer_for
    from rlctl.trainer.setup.prompts import to_proto

    (tmp_path / "oracle.py").write_text(ORACLE)
    profile = load_profile(
        ROOT / "profiles/agent-guess-openai.toml",
        [f'agent.openai_agent="{tmp_path / "oracle.py"}"', 'reward.kind="exact"'],
    )
    batcher = PromptBatcher(PromptDataset(GuessTask().rows("validation", 4, seed=1)), tok, 1)
    prompts = to_proto(batcher.make_batch([0, 1, 2, 3]))
    engine = HFRolloutEngine(GUESS_SFT)
    scored = episode_accuracy(engine, tok, prompts, profile, str(GUESS_SFT), scorer=scorer_for(profile, tok))
    assert scored["accuracy"] == 1.0 and scored["score_mean"] == 1.0 and scored["n"] == 4.0
    unscored = episode_accuracy(engine, tok, prompts, profile, str(GUESS_SFT))
    assert unscored["accuracy"] == 0.0  # without the profile's reward an answer is not a success
