"""Property tests of top-k / top-p filtering, sampling and the shared log-prob helpers, on every
test device (the draws use a generator on the logits' device)."""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

from rlctl.engines.logprob import position_ids_from_mask, token_log_probs, token_log_probs_and_entropy
from rlctl.engines.sampling import filter_top_k_top_p, sample_tokens

rows = st.integers(1, 4)
vocab = st.integers(2, 40)


@given(rows, vocab, st.integers(0, 45), st.integers(0, 2**16))
def test_top_k_keeps_exactly_the_k_largest(device, b, v, k, seed):
    scores = torch.randn(b, v, generator=torch.Generator().manual_seed(seed))
    kept = torch.isfinite(filter_top_k_top_p(scores.to(device), top_k=k)).cpu()
    expect = min(k, v) if k > 0 else v
    assert torch.all(kept.sum(-1) == expect)
    if 0 < k < v:
        kth = torch.topk(scores, k).values[:, -1:]
        assert torch.equal(kept, scores >= kth)


@given(rows, vocab, st.floats(0.01, 1.0), st.integers(0, 2**16))
def test_top_p_keeps_the_smallest_nucleus_with_enough_mass(device, b, v, p, seed):
    scores = torch.randn(b, v, generator=torch.Generator().manual_seed(seed)) * 3
    kept = torch.isfinite(filter_top_k_top_p(scores.to(device), top_p=p)).cpu()
    probs = torch.softmax(scores, -1)
    for i in range(b):
        assert kept[i, probs[i].argmax()]
        mass = probs[i][kept[i]].sum()
        if p < 1.0:
            assert mass >= p - 1e-6
            # dropping the least likely kept token would fall below p (minimality)
            if kept[i].sum() > 1:
                assert mass - probs[i][kept[i]].min() < p + 1e-6
        # every kept token is at least as likely as every dropped one
        if (~kept[i]).any():
            assert probs[i][kept[i]].min() >= probs[i][~kept[i]].max()


def test_samples_follow_the_softmax(device):
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]], device=device).expand(20000, 4)

    def gen(seed: int) -> torch.Generator:
        return torch.Generator(device=device).manual_seed(seed)

    draws = sample_tokens(logits, generator=gen(0))
    assert draws.device.type == device
    freq = torch.bincount(draws, minlength=4).float() / draws.numel()
    assert torch.allclose(freq, torch.softmax(logits[0], -1), atol=0.015)
    truncated = sample_tokens(logits, top_k=2, generator=gen(0))
    assert set(truncated.tolist()) == {0, 1}
    assert torch.equal(sample_tokens(logits, generator=gen(1)), sample_tokens(logits, generator=gen(1)))
    assert not torch.equal(sample_tokens(logits, generator=gen(1)), sample_tokens(logits, generator=gen(2)))
    greedy = sample_tokens(logits[:3], greedy=True)
    assert torch.equal(greedy.cpu(), torch.zeros(3, dtype=torch.long))


@given(st.floats(0.1, 3.0), st.integers(0, 2**16))
def test_log_probs_and_entropy_under_temperature(device, temp, seed):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(3, 5, 7, generator=g)
    tokens = torch.randint(0, 7, (3, 5), generator=g)
    p = torch.softmax(logits.double() / temp, -1)
    lp, ent = token_log_probs_and_entropy(logits.to(device), tokens.to(device), temp)
    assert lp.device.type == ent.device.type == device
    lp, ent = lp.cpu(), ent.cpu()
    assert torch.allclose(lp.double(), p.log().gather(-1, tokens[..., None]).squeeze(-1), atol=1e-5)
    assert torch.allclose(ent.double(), -(p * p.log()).sum(-1), atol=1e-5)
    assert torch.equal(token_log_probs(logits.to(device), tokens.to(device), temp).cpu(), lp)


def test_position_ids_follow_verl_convention():
    mask = torch.tensor([[0, 0, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]])
    assert position_ids_from_mask(mask).tolist() == [[0, 0, 0, 1, 2, 2], [0, 1, 2, 3, 4, 5]]
