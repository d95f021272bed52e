"""Property tests of top-k / top-p filtering, sampling and the shared log-prob helpers, on every
test device (the draws use a generator on the logits' device)."""

from __future__ import annotations

import torch
from hypothesis import given, settings
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


def test_a_152k_vocabulary_is_sampled_exactly_into_its_tail():
    """Most mass on 16 tokens, 25e-9 on each of the 152k later ones: a float32 CDF gives 88k of them
    an empty interval (never drawn). Every bin's frequency follows the softmax (chi-square), and
    the tokens a float32 CDF cannot reach are drawn at their rate."""
    vocab, head, p_tail = 152_064, 16, 2.5e-8
    weights = torch.tensor([30, 20, 10, 8, 7, 6, 5, 4, 3, 2, 1.5, 1, 0.8, 0.7, 0.6, 0.4], dtype=torch.float64)
    tail_mass = p_tail * (vocab - head)
    probs = torch.cat(
        [weights / weights.sum() * (1 - tail_mass), torch.full((vocab - head,), p_tail).double()]
    )
    logits = probs.log().float()[None]
    cdf32 = torch.softmax(logits, -1).cumsum(-1)[0]
    unreachable = torch.cat([torch.tensor([False]), cdf32[1:] == cdf32[:-1]])
    assert unreachable.sum() > 80_000
    gen = torch.Generator().manual_seed(0)
    draws = torch.cat([sample_tokens(logits.expand(100, vocab), generator=gen) for _ in range(100)])
    bins = torch.where(draws < head, draws, torch.where(unreachable[draws], head + 1, head))
    observed = torch.bincount(bins, minlength=head + 2).double()
    expected = torch.cat(
        [probs[:head], probs[head:][~unreachable[head:]].sum()[None], probs[unreachable].sum()[None]]
    )
    expected = expected * draws.numel()
    assert expected[-1] > 20
    chi2 = float(((observed - expected) ** 2 / expected).sum())
    assert chi2 < 40.79, (chi2, observed.tolist(), expected.tolist())  # 17 dof, p = 0.001
    assert observed[-1] >= 5  # the float32-unreachable tail is drawn
    again = sample_tokens(logits.expand(100, vocab), generator=torch.Generator().manual_seed(0))
    assert torch.equal(again, draws[:100])  # reproducible under the generator


@settings(max_examples=60, deadline=None)
@given(
    vocab=st.integers(1, 1200),
    rows=st.integers(1, 6),
    block=st.sampled_from([1, 7, 256]),
    zero_frac=st.floats(0.0, 0.95),
    seed=st.integers(0, 2**16),
)
def test_two_level_cdf_draws_what_one_float64_scan_draws(vocab, rows, block, zero_frac, seed):
    """The blocked inverse CDF against the plain float64 scan over the whole vocabulary: the same
    token for every uniform, zero-probability (filtered) tokens never drawn, ends included."""
    from rlctl.engines.sampling import inverse_cdf

    g = torch.Generator().manual_seed(seed)
    probs = torch.softmax(3 * torch.randn(rows, vocab, generator=g), -1)
    probs = probs * (torch.rand(rows, vocab, generator=g) >= zero_frac)
    probs[:, torch.randint(vocab, (1,), generator=g)] += 1e-3  # one nonzero token at least
    u = torch.cat([torch.rand(rows, 30, generator=g, dtype=torch.float64), torch.zeros(rows, 1)], 1)
    u = torch.cat([u, torch.full((rows, 1), 1.0 - 2**-53, dtype=torch.float64)], 1)
    cdf = probs.cumsum(-1, dtype=torch.float64)
    for k in range(u.shape[1]):
        x = torch.minimum(u[:, k : k + 1] * cdf[:, -1:], torch.nextafter(cdf[:, -1:], torch.zeros(1).double()))
        want = torch.searchsorted(cdf, x, right=True).squeeze(-1)
        got = inverse_cdf(probs, u[:, k : k + 1], block=block)
        assert bool((probs.gather(1, got[:, None]) > 0).all())
        # the two sums differ only by float64 rounding: a different token only at a boundary
        edge = cdf.gather(1, torch.minimum(got, want)[:, None])
        assert bool(((got == want)[:, None] | ((x - edge).abs() < 1e-12)).all())
