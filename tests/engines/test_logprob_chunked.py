"""The chunked log-prob/entropy autograd function against the plain full-vocabulary formulas."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlctl.engines.logprob import response_logits, token_log_probs, token_log_probs_and_entropy


def reference(logits: torch.Tensor, tokens: torch.Tensor, temperature: float):
    """The formulas before chunking: full (tokens x vocab) log-softmax, gather, -sum p log p."""
    logits = logits.float() if logits.dtype != torch.float64 else logits
    if temperature != 1.0:
        logits = logits / temperature
    logp = torch.log_softmax(logits, dim=-1)
    picked = logp.gather(-1, tokens.unsqueeze(-1).long()).squeeze(-1)
    return picked, -(logp.exp() * logp).sum(-1)


def _case(shape, seed=0, scale=3.0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dtype)
    tokens = torch.randint(0, shape[-1], shape[:-1], generator=g)
    weights = torch.randn(2, *shape[:-1], generator=g, dtype=torch.float64)
    return logits, tokens, weights


@pytest.mark.parametrize("temperature", [0.7, 1.0])
@pytest.mark.parametrize("chunk", [1, 3, None])
def test_gradcheck_in_float64(temperature, chunk):
    logits, tokens, _ = _case((2, 3, 6), dtype=torch.float64)
    logits.requires_grad_(True)
    both = lambda z: token_log_probs_and_entropy(z, tokens, temperature, chunk_tokens=chunk)  # noqa: E731
    assert torch.autograd.gradcheck(both, (logits,))
    entropy_only = lambda z: both(z)[1]  # noqa: E731
    assert torch.autograd.gradcheck(entropy_only, (logits,))
    picked_only = lambda z: token_log_probs(z, tokens, temperature, chunk_tokens=chunk)  # noqa: E731
    assert torch.autograd.gradcheck(picked_only, (logits,))


def test_gradcheck_through_a_sliced_batch_of_logits():
    """A ``response_logits`` slice does not flatten to a view: the chunks walk its rows instead."""
    logits, tokens, _ = _case((2, 7, 5), dtype=torch.float64)
    logits.requires_grad_(True)
    fn = lambda z: token_log_probs_and_entropy(response_logits(z, 3), tokens[:, :3], 0.7, chunk_tokens=2)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (logits,))


def _loss_grads(fn, logits, tokens, weights, temperature, **kw):
    leaf = logits.clone().requires_grad_(True)
    picked, entropy = fn(leaf, tokens, temperature, **kw)
    (picked * weights[0].to(picked.dtype) + entropy * weights[1].to(picked.dtype)).sum().backward()
    return picked, entropy, leaf.grad


@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_float32_values_and_gradients_match_the_plain_formulas(temperature):
    logits, tokens, weights = _case((3, 7, 1000))
    new = _loss_grads(token_log_probs_and_entropy, logits, tokens, weights, temperature, chunk_tokens=4)
    old = _loss_grads(reference, logits, tokens, weights, temperature)
    for got, want in zip(new, old, strict=True):
        assert got.dtype == want.dtype == torch.float32
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-5 * want.abs().max().item())
    picked_only = logits.clone().requires_grad_(True)
    (token_log_probs(picked_only, tokens, temperature) * weights[0].float()).sum().backward()
    ref_only = logits.clone().requires_grad_(True)
    (reference(ref_only, tokens, temperature)[0] * weights[0].float()).sum().backward()
    assert torch.allclose(
        picked_only.grad, ref_only.grad, rtol=1e-5, atol=1e-5 * ref_only.grad.abs().max().item()
    )


def test_unused_entropy_contributes_no_gradient():
    logits, tokens, weights = _case((2, 4, 50))
    leaf = logits.clone().requires_grad_(True)
    picked, _ = token_log_probs_and_entropy(leaf, tokens, 0.7, chunk_tokens=3)
    (picked * weights[0].float()).sum().backward()
    ref = logits.clone().requires_grad_(True)
    (reference(ref, tokens, 0.7)[0] * weights[0].float()).sum().backward()
    assert torch.allclose(leaf.grad, ref.grad, atol=1e-6)


def test_bfloat16_logits_give_float32_values_and_a_bfloat16_gradient():
    logits, tokens, weights = _case((2, 5, 300), dtype=torch.bfloat16)
    picked, entropy, grad = _loss_grads(
        token_log_probs_and_entropy, logits, tokens, weights, 0.7, chunk_tokens=3
    )
    want_picked, want_entropy, want_grad = _loss_grads(reference, logits, tokens, weights, 0.7)
    assert picked.dtype == entropy.dtype == torch.float32 and grad.dtype == torch.bfloat16
    assert torch.allclose(picked, want_picked, atol=1e-5) and torch.allclose(entropy, want_entropy, atol=1e-5)
    assert torch.allclose(
        grad.float(), want_grad.float(), rtol=1e-2, atol=1e-2 * want_grad.abs().max().item()
    )


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.integers(1, 4), min_size=1, max_size=3),
    st.integers(2, 40),
    st.floats(0.2, 3.0),
    st.integers(1, 9),
    st.booleans(),
    st.integers(0, 2**16),
)
def test_any_shape_temperature_and_chunk_agree_with_the_plain_formulas(
    lead, vocab, temperature, chunk, slice_it, seed
):
    shape = (*lead, vocab)
    logits, tokens, weights = _case(shape, seed=seed)
    if slice_it and len(lead) >= 2 and lead[1] >= 2:  # a non-viewable slice along dim 1
        logits, tokens, weights = logits[:, 1:], tokens[:, 1:], weights[:, :, 1:]
    new = _loss_grads(token_log_probs_and_entropy, logits, tokens, weights, temperature, chunk_tokens=chunk)
    old = _loss_grads(reference, logits, tokens, weights, temperature)
    for got, want in zip(new, old, strict=True):
        assert got.shape == want.shape
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-5 * max(1.0, want.abs().max().item()))


def test_bad_temperature_and_chunk_are_rejected():
    logits, tokens, _ = _case((2, 5))
    with pytest.raises(ValueError, match="temperature"):
        token_log_probs(logits, tokens, 0.0)
    with pytest.raises(ValueError, match="chunk_tokens"):
        token_log_probs_and_entropy(logits, tokens, chunk_tokens=0)
