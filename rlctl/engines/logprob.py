"""Log-probs and entropy of tokens under a temperature: the one formula both engines use.

Training and rollout must agree on what "the log-prob of a sampled token" means (TRL #4159 was a
temperature applied in one place and not the other). Both engines call these helpers, so the
definition lives once: ``log_softmax(logits / temperature)`` over the full vocabulary, no top-k or
top-p truncation.

The training helpers (:func:`token_log_probs`, :func:`token_log_probs_and_entropy`) walk the
tokens in chunks: at a 49k-152k vocabulary a plain ``log_softmax`` of a batch's logits holds
several fp32 (tokens x vocab) tensors (the upcast, the scaled copy, the log-softmax, its ``exp``
and the entropy product, most of them saved for backward). Here only the input logits (in their
own dtype) and a few numbers per token are kept; the backward recomputes each chunk's softmax.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.autograd.function import once_differentiable

CHUNK_ELEMENTS = 1 << 20
"""Default chunk: this many logits (4 MiB per fp32 temporary), rounded down to whole tokens."""


def scaled_log_softmax(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """``log_softmax(logits / temperature)`` in fp32 over the last dim."""
    _check_temperature(temperature)
    return _chunk_log_softmax(logits, temperature, torch.float32)


def _check_temperature(temperature: float) -> None:
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")


def _compute_dtype(logits: torch.Tensor) -> torch.dtype:
    """fp32 for every input but float64 (kept in float64, so gradcheck can check the backward)."""
    return torch.float64 if logits.dtype == torch.float64 else torch.float32


def _row_blocks(logits: torch.Tensor) -> Iterator[torch.Tensor]:
    """2-D views (rows, V) covering the tokens in order without copying: the whole tensor when it
    flattens to a view, else per index of the leading dim (e.g. a ``[:, a:b]`` slice of a batch)."""
    if logits.dim() <= 2:
        yield logits.reshape(-1, logits.shape[-1])
        return
    try:
        yield logits.view(-1, logits.shape[-1])
    except RuntimeError:
        for row in logits.unbind(0):
            yield from _row_blocks(row)


def _chunks(logits: torch.Tensor, chunk_tokens: int) -> Iterator[tuple[int, torch.Tensor]]:
    """``(flat offset, (rows, V) view)`` chunks of at most ``chunk_tokens`` tokens, in order."""
    offset = 0
    for block in _row_blocks(logits):
        for start in range(0, block.shape[0], chunk_tokens):
            part = block[start : start + chunk_tokens]
            yield offset, part
            offset += part.shape[0]


def _chunk_log_softmax(part: torch.Tensor, temperature: float, dtype: torch.dtype) -> torch.Tensor:
    """``log_softmax(part / T)`` in ``dtype`` (the upcast divided in place when it is a copy)."""
    scaled = part.to(dtype)
    if temperature != 1.0:
        scaled = scaled.div_(temperature) if scaled is not part else scaled / temperature
    return torch.log_softmax(scaled, dim=-1)


class _ChunkedTokenLogProbs(torch.autograd.Function):
    """(picked log-prob, entropy) per token, computed and differentiated chunk by chunk."""

    @staticmethod
    def forward(ctx, logits, tokens, temperature, chunk_tokens, with_entropy):
        dtype = _compute_dtype(logits)
        flat_tokens = tokens.reshape(-1).long()
        count = flat_tokens.numel()
        picked = torch.empty(count, dtype=dtype, device=logits.device)
        entropy = torch.empty(count, dtype=dtype, device=logits.device) if with_entropy else None
        for offset, part in _chunks(logits, chunk_tokens):
            end = offset + part.shape[0]
            logp = _chunk_log_softmax(part, temperature, dtype)
            picked[offset:end] = logp.gather(-1, flat_tokens[offset:end, None]).squeeze(-1)
            if entropy is not None:
                entropy[offset:end] = -(logp.exp() * logp).sum(-1)
        ctx.save_for_backward(logits, flat_tokens, entropy if entropy is not None else picked)
        ctx.temperature, ctx.chunk_tokens, ctx.with_entropy = temperature, chunk_tokens, with_entropy
        ctx.set_materialize_grads(False)
        shape = tokens.shape
        outputs = (picked.view(shape), entropy.view(shape) if entropy is not None else picked.new_empty(0))
        if not with_entropy:
            ctx.mark_non_differentiable(outputs[1])
        return outputs

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_picked, grad_entropy):
        logits, flat_tokens, entropy = ctx.saved_tensors
        if not ctx.with_entropy:
            grad_entropy = None
        if grad_picked is None and grad_entropy is None:
            return None, None, None, None, None
        temperature, dtype = ctx.temperature, _compute_dtype(logits)
        grad = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
        flat_grad = grad.view(-1, logits.shape[-1])
        g_picked = None if grad_picked is None else grad_picked.reshape(-1).to(dtype)
        g_entropy = None if grad_entropy is None else grad_entropy.reshape(-1).to(dtype)
        direct = logits.dtype == dtype  # write each chunk's gradient straight into ``grad``
        for offset, part in _chunks(logits, ctx.chunk_tokens):
            end = offset + part.shape[0]
            logp = _chunk_log_softmax(part, temperature, dtype)
            probs = logp.exp()
            # z = logits / T. d picked / dz = onehot - p; d H / dz = -p (log p + H) for
            # H = -sum p log p. So dL/dlogits = -(p / T) (gH (log p + H) + gP) + onehot gP / T,
            # the per-row factors folded first so the (rows, V) work is one mul_, add_ and mul.
            if g_entropy is None:
                logp = g_picked[offset:end, None] * (-1.0 / temperature)
            else:
                scale = g_entropy[offset:end, None] * (-1.0 / temperature)
                shift = entropy[offset:end, None] * scale
                if g_picked is not None:
                    shift = shift - g_picked[offset:end, None] / temperature
                logp.mul_(scale).add_(shift)
            target = flat_grad[offset:end]
            chunk_grad = torch.mul(probs, logp, out=target) if direct else probs.mul_(logp)
            if g_picked is not None:
                index = flat_tokens[offset:end, None]
                chunk_grad.scatter_add_(-1, index, g_picked[offset:end, None] / temperature)
            if not direct:  # one rounding to the logits' dtype, after the whole sum
                target.copy_(chunk_grad)
        return grad, None, None, None, None


def _chunk_size(logits: torch.Tensor, chunk_tokens: int | None) -> int:
    if chunk_tokens is None:
        return max(1, CHUNK_ELEMENTS // max(1, logits.shape[-1]))
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    return chunk_tokens


def token_log_probs(
    logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0, *, chunk_tokens: int | None = None
) -> torch.Tensor:
    """Log-prob of ``tokens`` (..., ) under ``logits`` (..., V) scaled by ``temperature``, fp32
    (float64 for float64 logits); ``chunk_tokens`` tokens at a time (default: about 1M logits)."""
    _check_temperature(temperature)
    picked, _ = _ChunkedTokenLogProbs.apply(
        logits, tokens, temperature, _chunk_size(logits, chunk_tokens), False
    )
    return picked


def token_log_probs_and_entropy(
    logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0, *, chunk_tokens: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob of ``tokens`` and entropy of the distribution, both under ``temperature`` (see
    :func:`token_log_probs`); the entropy's gradient is computed only when a loss uses it."""
    _check_temperature(temperature)
    return _ChunkedTokenLogProbs.apply(logits, tokens, temperature, _chunk_size(logits, chunk_tokens), True)


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """verl's convention: ``cumsum(mask) - 1`` clipped at 0 (left padding gets position 0)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def response_logits(logits: torch.Tensor, response_length: int) -> torch.Tensor:
    """Logits that predict the response tokens: positions ``P-1 .. P+R-2`` of a (B, P+R, V) output."""
    return logits[:, -response_length - 1 : -1]
