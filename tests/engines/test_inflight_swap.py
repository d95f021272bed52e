"""In-flight weight updates in the HF engine: a sequence spanning a swap carries both versions, and
each token's behaviour log-prob is the score of the weights it was sampled with (KV cache rebuilt on
the swap); keeping the old cache (PipelineRL's choice) leaves a measurable gap."""

from __future__ import annotations

import pytest
import torch

from rlctl.engines.hf_rollout import HFRolloutEngine
from rlctl.errors import UserError
from tests.engines.helpers import PAD, make_batch, make_model

torch.set_num_threads(1)
SWAP_AFTER = 4  # tokens 0..3 sampled with version 1, the rest with version 2
NEW_TOKENS = 10


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    return HFRolloutEngine(make_model(tmp_path_factory.mktemp("m") / "a", seed=3))


def _weights(engine):
    w1 = {n: t.detach().clone() for n, t in engine.local_tensors().items()}
    g = torch.Generator().manual_seed(0)
    w2 = {n: t + 0.5 * t.std().nan_to_num(0.02) * torch.randn(t.shape, generator=g) for n, t in w1.items()}
    return w1, w2


def _generate(engine, w1, w2, kv_on_swap):
    engine.update_weights(w1.items())
    b = make_batch(3, prompt_len=6, resp_len=1, seed=0)  # mixed left-padded lengths
    calls = []

    def swap():
        calls.append(1)
        return (2, list(w2.items())) if len(calls) == SWAP_AFTER else None

    return engine.generate(
        b["input_ids"][:, :6],
        b["attention_mask"][:, :6],
        n=2,
        temperature=1.0,
        seed=7,
        max_new_tokens=NEW_TOKENS,
        eos_token_id=None,  # every row runs through the swap
        pad_token_id=PAD,
        version=1,
        swap=swap,
        kv_on_swap=kv_on_swap,
    )


def _scores(engine, weights, out) -> torch.Tensor:
    """Each row's response tokens scored by ``weights`` (one teacher-forced forward per row)."""
    engine.update_weights(weights.items())
    rows = []
    for ids, mask in zip(out["input_ids"], out["attention_mask"], strict=True):
        tokens = ids[mask.bool()].tolist()
        rows.append(engine.prompt_log_probs(tokens)[-NEW_TOKENS:])
    return torch.stack(rows)


def test_a_sequence_spanning_a_swap_carries_both_versions_with_exact_log_probs(engine):
    w1, w2 = _weights(engine)
    out = _generate(engine, w1, w2, "recompute")
    versions = out["token_versions"]
    want = torch.tensor([1] * SWAP_AFTER + [2] * (NEW_TOKENS - SWAP_AFTER))
    assert all(torch.equal(row, want) for row in versions), versions
    got = out["rollout_log_probs"]
    s1, s2 = _scores(engine, w1, out), _scores(engine, w2, out)
    old, new = versions == 1, versions == 2
    assert (got[old] - s1[old]).abs().max() < 1e-4
    assert (got[new] - s2[new]).abs().max() < 1e-4
    assert (s1[new] - s2[new]).abs().mean() > 0.05  # the two policies do differ on those tokens


def test_keeping_the_old_kv_cache_leaves_a_gap_to_the_new_weights_scores(engine):
    w1, w2 = _weights(engine)
    out = _generate(engine, w1, w2, "keep")
    new = out["token_versions"] == 2
    gap = (out["rollout_log_probs"][new] - _scores(engine, w2, out)[new]).abs()
    assert gap.mean() > 1e-3, gap.mean()


def test_unknown_kv_policy_is_refused(engine):
    b = make_batch(1, prompt_len=6, resp_len=1, seed=0)
    with pytest.raises(UserError, match="kv_on_swap"):
        engine.generate(
            b["input_ids"][:, :6], b["attention_mask"][:, :6], max_new_tokens=2, kv_on_swap="drop"
        )
