"""The built-in guess-the-number game: feedback turns, and warm-up traces that are exactly the
episodes the rollout builds when the policy samples the trace's guesses."""

from __future__ import annotations

import pytest
import torch

from rlctl.agents import parse_turn, run_episodes
from rlctl.agents.batch import episode_rows
from rlctl.agents.builtin import GuessEnv
from rlctl.data.batcher import left_pad
from rlctl.data.dataset import PromptDataset, encode_prompt
from rlctl.data.sft import SFTDataset
from rlctl.data.tasks.guess import GuessTask
from rlctl.dispatch import DataProto
from rlctl.models.tokenizer import build_char_tokenizer


def test_env_answers_higher_lower_and_scores_the_hit():
    env = GuessEnv()
    env.start({"ground_truth": "3"})
    assert env.step(parse_turn("5", 0)).messages == [{"role": "user", "content": "lower"}]
    assert env.step(parse_turn("1", 1)).messages == [{"role": "user", "content": "higher"}]
    hit = env.step(parse_turn(" 3", 2))
    assert hit.done and hit.reward == 1.0
    assert env.step(parse_turn("x", 0)).reward == 0.0


def test_warmup_traces_replay_token_for_token():
    tok = build_char_tokenizer()
    rows = GuessTask().rows("train", 40, seed=1)
    sft = SFTDataset(PromptDataset(rows), tok)
    prompts = [encode_prompt(tok, r["prompt"]) for r in rows]
    ids, mask, _ = left_pad(prompts, tok.pad_token_id)
    guesses = [
        [g.split("<|eos|>")[0] for g in r["extra_info"]["answer"].split("<|assistant|>")] for r in rows
    ]
    calls = []

    def generate(ids, mask, *, pad_token_id, **_):
        k = len(calls)
        calls.append(ids.shape[0])
        live = [i for i, gs in enumerate(guesses) if len(gs) > k]
        out = [tok(guesses[i][k] + "<|eos|>", add_special_tokens=False)["input_ids"] for i in live]
        resp = torch.tensor(out)
        return {"responses": resp, "response_mask": torch.ones_like(resp), "rollout_log_probs": resp * 0.0}

    nt = DataProto.from_dict(
        tensors={"x": torch.zeros(len(rows))},
        non_tensors={
            "ground_truth": [r["reward_model"]["ground_truth"] for r in rows],
            "extra_info": [r["extra_info"] for r in rows],
        },
    )
    batch, _ = run_episodes(
        generate,
        tok,
        [GuessEnv() for _ in rows],
        episode_rows(nt),
        ids,
        mask,
        max_turns=3,
        max_tokens=32,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    for i, item in enumerate(sft.items):
        got = batch["responses"][i][batch["attention_mask"][i, ids.shape[1] :].bool()].tolist()
        assert got == item["input_ids"][len(prompts[i]) :]
        won = rows[i]["reward_model"]["ground_truth"] == guesses[i][-1]
        assert batch["agent_success"][i].item() == float(won)
    assert 0.2 < batch["agent_success"].mean().item() < 0.8
    assert batch["agent_turns"].tolist() == [float(len(g)) for g in guesses]


def test_question_style_asks_the_same_problems_in_words():
    game = GuessTask().rows("validation", 12, seed=0)
    question = GuessTask(style="question").rows("validation", 12, seed=0)
    assert [r["reward_model"] for r in game] == [r["reward_model"] for r in question]
    hi = question[0]["extra_info"]["hi"]
    assert question[0]["prompt"][-1]["content"] == f"Pick a number between 0 and {hi}. Reply with just the digit."
    assert game[0]["prompt"][-1]["content"] == f"guess 0-{hi}"
    with pytest.raises(ValueError, match="style must be one of game, question"):
        GuessTask(style="prose")
