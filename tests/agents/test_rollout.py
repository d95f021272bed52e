"""Multi-turn rollout: rows end at different turns, observations are appended as ids, only model
tokens are in the mask, and the trainer scores exactly the ids and log-probs the engine produced."""

from __future__ import annotations

import pytest
import torch

from rlctl.agents import ObservationRenderer, run_episodes
from rlctl.data.batcher import left_pad
from rlctl.data.dataset import encode_prompt
from rlctl.engines.fsdp_train import FSDPTrainEngine
from rlctl.engines.hf_rollout import HFRolloutEngine
from rlctl.trainer.plan.specs import ActorLossSpec
from rlctl.trainer.workers.losses import make_actor_loss
from tests.agents.helpers import ScriptedEnv, rows_with_turns

torch.set_num_threads(1)
TURNS = [1, 2, 3, 2, 3, 1]


class Recorder:
    """Wraps an engine's generate; keeps every call's inputs and outputs."""

    def __init__(self, engine):
        self.engine, self.calls = engine, []

    def __call__(self, ids, mask, **kw):
        out = self.engine.generate(ids, mask, **kw)
        self.calls.append((ids.clone(), mask.clone(), out))
        return out


def _episodes(model_path, turns=TURNS, **kw):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_path))
    rows = rows_with_turns(turns)
    ids, mask, _ = left_pad([encode_prompt(tok, r["prompt"]) for r in rows], tok.pad_token_id)
    rec = Recorder(HFRolloutEngine(model_path))
    batch, conversations = run_episodes(
        rec,
        tok,
        [ScriptedEnv() for _ in rows],
        rows,
        ids,
        mask,
        max_turns=4,
        max_tokens=kw.pop("max_tokens", 160),
        max_turn_tokens=kw.pop("max_turn_tokens", 12),
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        seed=3,
        temperature=1.0,
        **kw,
    )
    return tok, rows, rec, batch, conversations


@pytest.fixture(scope="module")
def plain(char_model):
    return _episodes(char_model)


@pytest.fixture(scope="module")
def think(think_model):
    return _episodes(think_model)


def _spans(mask_row: torch.Tensor, attn_row: torch.Tensor) -> list[tuple[int, int, int]]:
    """(value, start, end) runs of the response mask over the attended part."""
    n = int(attn_row.sum())
    runs, start = [], 0
    for i in range(1, n + 1):
        if i == n or mask_row[i] != mask_row[start]:
            runs.append((int(mask_row[start]), start, i))
            start = i
    return runs


def test_rows_finish_at_different_turns_in_one_batch(plain):
    _, _, rec, batch, conversations = plain
    assert batch["agent_turns"].tolist() == [float(t) for t in TURNS]
    assert batch["agent_reward"].tolist() == [float(t) for t in TURNS]
    # each turn generated only for the rows still running
    assert [c[0].shape[0] for c in rec.calls] == [sum(t > k for t in TURNS) for k in range(max(TURNS))]
    assert [sum(m["role"] == "assistant" for m in c) for c in conversations] == TURNS


def test_observations_are_appended_as_ids_and_masked_out(plain):
    tok, _, _, batch, conversations = plain
    renderer = ObservationRenderer(tok)
    resp, rmask = batch["responses"], batch["response_mask"]
    attn = batch["attention_mask"][:, -resp.shape[1] :]
    for i, turns in enumerate(TURNS):
        runs = _spans(rmask[i], attn[i])
        assert [v for v, _, _ in runs] == [1, 0] * (turns - 1) + [1]  # model, obs, ..., model
        for k, (_, s, e) in enumerate(runs[1::2]):
            model_turn = resp[i, runs[2 * k][1] : runs[2 * k][2]].tolist()
            stop = tok.decode(model_turn[-1:]) if model_turn[-1] == tok.eos_token_id else None
            want = renderer.encode([{"role": "tool", "content": f"obs{k}"}], stop)
            assert resp[i, s:e].tolist() == want
        assert batch["rollout_log_probs"][i][rmask[i] == 0].abs().sum() == 0


def test_each_turn_is_sent_the_exact_ids_so_far(plain):
    """Token-in: turn k's context is the prompt plus every earlier id, never a re-tokenised text."""
    _, _, rec, batch, _ = plain
    width = batch["responses"].shape[1]
    seqs = [
        row[m.bool()].tolist() for row, m in zip(batch["input_ids"], batch["attention_mask"], strict=True)
    ]
    prompt_len = [int(m[:-width].sum()) for m in batch["attention_mask"]]
    active = list(range(len(TURNS)))
    for k, (ids, mask, out) in enumerate(rec.calls):
        for row, i in enumerate(active):
            sent = ids[row][mask[row].bool()].tolist()
            assert seqs[i][: len(sent)] == sent
            got = out["responses"][row][out["response_mask"][row].bool()].tolist()
            assert seqs[i][len(sent) : len(sent) + len(got)] == got  # the engine's tokens, unchanged
            assert len(sent) >= prompt_len[i]
        active = [i for i in active if TURNS[i] > k + 1]


@pytest.mark.parametrize("which", ["plain", "think"])
def test_trainer_log_probs_equal_the_rollouts_on_model_tokens(which, request, char_model, think_model):
    tok, _, _, batch, conversations = request.getfixturevalue(which)
    path = char_model if which == "plain" else think_model
    trainer = FSDPTrainEngine(path, micro_batch_size=4)
    recomputed = trainer.compute_log_prob(batch, temperature=1.0)["log_probs"]
    mask = batch["response_mask"].bool()
    assert torch.allclose(recomputed[mask], batch["rollout_log_probs"][mask], atol=1e-5, rtol=0)
    if which == "think":
        # the template rewrites earlier turns when the conversation is re-rendered: a trainer that
        # re-tokenised the conversation would score other tokens than the engine sampled
        width = batch["responses"].shape[1]
        for i, turns in enumerate(TURNS):
            if turns < 2:
                continue
            ids = batch["input_ids"][i][batch["attention_mask"][i].bool()].tolist()
            rendered = tok.apply_chat_template(conversations[i], tokenize=False)
            assert "<think></think>" in tok.decode(ids[: len(ids) - 1])
            assert tok(rendered, add_special_tokens=False)["input_ids"] != ids
        assert width == 160


def test_observation_tokens_get_zero_gradient(plain, char_model):
    _, _, _, batch, _ = plain
    rmask = batch["response_mask"]
    obs = (batch["attention_mask"][:, -rmask.shape[1] :] == 1) & (rmask == 0)
    assert obs.any()
    loss = make_actor_loss(ActorLossSpec())
    grads = []

    def run(advantages: torch.Tensor) -> list[torch.Tensor]:
        engine = FSDPTrainEngine(char_model, micro_batch_size=64)
        captured = []

        def loss_fn(out, mb, scale):
            out["log_probs"].retain_grad()
            captured.append(out["log_probs"])
            return loss(out, mb, scale)

        mb = {
            k: batch[k] for k in ("input_ids", "attention_mask", "position_ids", "responses", "response_mask")
        }
        engine.train_batch({**mb, "advantages": advantages}, loss_fn, with_entropy=False)
        grads.append(captured[0].grad.clone())
        return [p.detach().clone() for p in engine.model.parameters()]

    adv = torch.randn(rmask.shape) * rmask
    after = run(adv)
    g = grads[0]
    assert torch.all(g[obs] == 0) and g[rmask.bool()].abs().sum() > 0
    # whatever advantages sit on observation positions, the update is the same
    noisy = run(adv + 100.0 * torch.randn(rmask.shape) * obs)
    assert all(torch.equal(a, b) for a, b in zip(after, noisy, strict=True))
