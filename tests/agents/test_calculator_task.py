"""The built-in calculator task: its SFT traces are exactly the episodes the rollout builds."""

from __future__ import annotations

import pytest
import torch

from rlctl.agents import run_episodes
from rlctl.agents.batch import episode_rows
from rlctl.agents.builtin import CalculatorEnv
from rlctl.data.batcher import left_pad
from rlctl.data.dataset import PromptDataset, encode_prompt
from rlctl.data.sft import SFTDataset
from rlctl.data.tasks.calculator import CalculatorTask
from rlctl.dispatch import DataProto
from rlctl.models.tokenizer import build_char_tokenizer


@pytest.mark.parametrize("operands_in_call", [0, 1])
def test_sft_trace_equals_the_rollout_of_a_perfect_policy(operands_in_call):
    """Operands from the row (verl's tools_kwargs) or written by the model: the episode of a policy
    that samples the trace's turns is the SFT item, id for id, and it succeeds."""
    tok = build_char_tokenizer()
    task = CalculatorTask(operands_in_call=operands_in_call)
    rows = task.rows("train", 3, seed=1)
    sft = SFTDataset(PromptDataset(rows), tok)
    prompts = [encode_prompt(tok, r["prompt"]) for r in rows]
    ids, mask, _ = left_pad(prompts, tok.pad_token_id)
    # what a perfect policy samples: the trace's model turns, turn by turn
    turns = [
        [tok(r["extra_info"]["tool_call"] + "<|eos|>", add_special_tokens=False)["input_ids"], None]
        for r in rows
    ]
    for t, r in zip(turns, rows, strict=True):
        t[1] = tok(r["reward_model"]["ground_truth"] + "<|eos|>", add_special_tokens=False)["input_ids"]
    calls = []

    def generate(ids, mask, *, max_new_tokens, pad_token_id, **_):
        k = len(calls)
        calls.append(ids.shape[0])
        out = [turns[i][k] for i in range(len(rows))]
        width = max(len(o) for o in out)
        resp = torch.full((len(out), width), pad_token_id)
        rmask = torch.zeros((len(out), width), dtype=torch.long)
        for i, o in enumerate(out):
            resp[i, : len(o)], rmask[i, : len(o)] = torch.tensor(o), 1
        return {"responses": resp, "response_mask": rmask, "rollout_log_probs": torch.zeros(resp.shape)}

    nt = DataProto.from_dict(
        tensors={"x": torch.zeros(len(rows))},
        non_tensors={
            "raw_prompt": [r["prompt"] for r in rows],
            "ground_truth": [r["reward_model"]["ground_truth"] for r in rows],
            "extra_info": [r["extra_info"] for r in rows],
        },
    )
    batch, _ = run_episodes(
        generate,
        tok,
        [CalculatorEnv() for _ in rows],
        episode_rows(nt),
        ids,
        mask,
        max_turns=3,
        max_tokens=100,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    assert batch["agent_reward"].tolist() == [1.0, 1.0, 1.0]
    assert batch["agent_tool_calls"].tolist() == [1.0, 1.0, 1.0]
    assert batch["agent_tool_errors"].tolist() == [0.0, 0.0, 0.0]
    assert ("tools_kwargs" in rows[0]["extra_info"]) == (not operands_in_call)
    for i, item in enumerate(sft.items):
        got = batch["responses"][i][batch["attention_mask"][i, ids.shape[1] :].bool()].tolist()
        assert got == item["input_ids"][len(prompts[i]) :]


def test_verifier_reads_the_final_answer_after_the_tool_call():
    task = CalculatorTask()
    call = '<tool_call>{"name":"mul","arguments":{"a":2,"b":3}}</tool_call>'
    assert task.verify(call + " 6", "6") == 1.0
    assert task.verify(call, "6") == 0.0
    assert task.verify("6", "6") == 1.0


def test_greedy_episode_accuracy_runs_in_process(char_model):
    from pathlib import Path

    from rlctl.agents.evaluate import episode_accuracy
    from rlctl.data.batcher import PromptBatcher
    from rlctl.engines.hf_rollout import HFRolloutEngine
    from rlctl.profile import load_profile
    from rlctl.trainer.setup.prompts import to_proto

    repo = Path(__file__).resolve().parents[2]
    profile = load_profile(
        repo / "profiles/agent-guess.toml", ["rollout.max_new_tokens=24", "agent.env=builtin:calculator"]
    )
    tok = build_char_tokenizer()
    batcher = PromptBatcher(PromptDataset(CalculatorTask().rows("validation", 3, seed=1)), tok, 1)
    prompts = to_proto(batcher.make_batch([0, 1, 2]))
    out = episode_accuracy(HFRolloutEngine(char_model), tok, prompts, profile, str(char_model))
    assert out["n"] == 3.0 and out["accuracy"] == 0.0  # a random model neither calls nor answers
    assert out["agent/turns_mean"] >= 1.0 and "agent/tool_errors_mean" in out
