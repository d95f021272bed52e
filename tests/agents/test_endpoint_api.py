"""Real OpenAI-client agent code through the endpoint on the HF engine: n, log-probs, streaming, a
rewritten history (the mismatch rule), and 64 concurrent episodes token-exact."""

from __future__ import annotations

import pytest
import torch

from rlctl.agents.chat import render
from rlctl.agents.endpoint import EndpointRollout
from rlctl.engines.hf_rollout import HFRolloutEngine

openai = pytest.importorskip(
    "openai", reason="the endpoint's client is the openai package: pip install 'rlctl[agent]'"
)
torch.set_num_threads(1)


class Recorder:
    """Wraps the engine's generate; keeps each call's unpadded prompts and sampled tokens."""

    def __init__(self, engine):
        self.engine, self.rows = engine, []

    def __call__(self, ids, mask, **kw):
        out = self.engine.generate(ids, mask, **kw)
        for i in range(ids.shape[0]):
            got = out["responses"][i][out["response_mask"][i].bool()].tolist()
            self.rows.append((ids[i][mask[i].bool()].tolist(), got))
        return out


def _rollout(model, agent, rows, *, max_tokens=96, gather_s=None, generate=None):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model))
    width = 16
    ids = torch.full((len(rows), width), tok.pad_token_id)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    run = EndpointRollout(
        generate or HFRolloutEngine(model).generate,
        tok,
        agent,
        rows,
        ids,
        mask,
        max_turns=[8] * len(rows),
        max_tokens=max_tokens,
        max_turn_tokens=0,
        eos_token_id=[tok.eos_token_id],
        pad_token_id=tok.pad_token_id,
        seed=11,
        sampling={"temperature": 1.0},
        gather_s=gather_s,
    )
    return tok, run, run.run()


def _segments(batch, i):
    """(mask value, ids) runs of row i's response."""
    n = int(batch["attention_mask"][i, -batch["responses"].shape[1] :].sum())
    resp, m = batch["responses"][i, :n].tolist(), batch["response_mask"][i, :n].tolist()
    lps = batch["rollout_log_probs"][i, :n].tolist()
    runs = []
    for k in range(n):
        if k == 0 or m[k] != m[k - 1]:
            runs.append((m[k], [], []))
        runs[-1][1].append(resp[k])
        runs[-1][2].append(lps[k])
    return runs


def test_n_logprobs_and_stream_are_recorded_exactly(char_model):
    seen = {}

    async def agent(client, row):
        msgs = [{"role": "user", "content": "hello"}]
        first = await client.chat.completions.create(
            model="m", messages=msgs, max_tokens=6, n=2, logprobs=True
        )
        seen["first"] = first
        msgs += [
            {"role": "assistant", "content": first.choices[0].message.content},
            {"role": "user", "content": "more"},
        ]
        stream = await client.chat.completions.create(
            model="m",
            messages=msgs,
            max_tokens=6,
            stream=True,
            logprobs=True,
            stream_options={"include_usage": True},
        )
        chunks = [c async for c in stream]
        seen["chunks"] = chunks
        return None  # the profile's reward scores it

    tok, run, batch = _rollout(char_model, agent, [{"prompt": []}])
    first, chunks = seen["first"], seen["chunks"]
    assert len(first.choices) == 2
    runs = _segments(batch, 0)
    assert [v for v, _, _ in runs] == [1, 0, 1]  # answer, the next request's new text, answer
    lp0 = [t.logprob for t in first.choices[0].logprobs.content]
    assert runs[0][2] == pytest.approx(lp0, abs=1e-6)  # the row follows choice 0 with its log-probs
    assert "".join(t.token for t in first.choices[0].logprobs.content) == tok.decode(runs[0][1])
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    stream_lps = [
        t.logprob
        for c in chunks
        if c.choices and c.choices[0].logprobs
        for t in c.choices[0].logprobs.content
    ]
    assert runs[2][2] == pytest.approx(stream_lps, abs=1e-6)
    assert tok.decode(runs[2][1]).startswith(text) and chunks[-1].usage.completion_tokens == len(runs[2][1])
    assert batch["agent_turns"].item() == 2 and torch.isnan(batch["agent_reward"]).all()
    assert batch["agent_prefix_mismatch"].item() == 0


def test_a_rewritten_history_starts_a_new_chain_and_is_counted(char_model):
    async def agent(client, row):
        await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "one"}], max_tokens=4
        )
        msgs = [{"role": "user", "content": "a summary"}]  # the agent dropped its history
        await client.chat.completions.create(model="m", messages=msgs, max_tokens=4)
        return 1

    tok, _, batch = _rollout(char_model, agent, [{"prompt": []}])
    assert batch["agent_prefix_mismatch"].item() == 1
    prompt = batch["prompts"][0][batch["attention_mask"][0, :16].bool()].tolist()
    want = render(tok, [{"role": "user", "content": "a summary"}], None)
    assert prompt == tok(want, add_special_tokens=False)["input_ids"]
    assert [v for v, _, _ in _segments(batch, 0)] == [1]  # the abandoned chain is not trained


def test_64_concurrent_episodes_of_4_turns_are_token_exact(char_model):
    async def agent(client, row):
        msgs = [{"role": "user", "content": f"q{row['i']}"}]
        for turn in range(4):
            reply = await client.chat.completions.create(model="m", messages=msgs, max_tokens=5)
            msgs += [
                {"role": "assistant", "content": reply.choices[0].message.content},
                {"role": "user", "content": f"t{turn}"},
            ]
        return 1.0

    from transformers import AutoTokenizer

    rec = Recorder(HFRolloutEngine(char_model))
    rows = [{"prompt": [], "i": i} for i in range(64)]
    tok, run, batch = _rollout(char_model, agent, rows, max_tokens=120, gather_s=0.05, generate=rec)
    assert batch["agent_turns"].tolist() == [4.0] * 64
    assert batch["agent_prefix_mismatch"].sum() == 0 and batch["agent_errors"].sum() == 0
    assert run.batcher.rows == 256 and run.batcher.batches < 256 // 4  # batched, not one by one
    sent = {tuple(p): g for p, g in rec.rows}
    width = batch["responses"].shape[1]
    for i in range(64):
        seq = batch["input_ids"][i][batch["attention_mask"][i].bool()].tolist()
        prompt_len = int(batch["attention_mask"][i, :-width].sum())
        resp_mask = batch["response_mask"][i][: len(seq) - prompt_len].tolist()
        starts = [prompt_len + k for k, m in enumerate(resp_mask) if m and (k == 0 or not resp_mask[k - 1])]
        assert len(starts) == 4
        for s in starts:  # the engine consumed exactly seq[:s] and sampled what follows it
            got = sent[tuple(seq[:s])]
            assert seq[s : s + len(got)] == got
    assert AutoTokenizer  # the tokenizer is the model's own
