"""Token selection for the HF rollout engine: temperature, top-k, top-p, greedy.

Truncation (top-k / top-p) only decides which tokens may be *drawn*; the log-prob the engine
reports for a drawn token is always under the untruncated ``softmax(logits / temperature)``,
which is what the training engine recomputes (the same convention as verl with vLLM).
"""

from __future__ import annotations

import torch


def filter_top_k_top_p(scores: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Set to -inf every score outside the top-k and outside the smallest nucleus of mass >= top_p.

    ``scores`` (B, V) are temperature-scaled logits; ``top_k <= 0`` and ``top_p >= 1`` disable a
    filter. The most likely token always survives. Ties at the k-th score are all kept.
    """
    if top_k > 0 and top_k < scores.shape[-1]:
        kth = torch.topk(scores, top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p < 1.0:
        sorted_scores, order = torch.sort(scores, dim=-1, descending=True)
        probs = torch.softmax(sorted_scores, dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs
        drop_sorted = mass_before >= top_p
        drop_sorted[..., 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        scores = scores.masked_fill(drop, float("-inf"))
    return scores


def sample_tokens(
    scaled_logits: torch.Tensor,
    *,
    top_k: int = 0,
    top_p: float = 1.0,
    greedy: bool = False,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """One token per row of temperature-scaled logits (B, V): argmax if ``greedy``, else a draw."""
    if greedy:
        return scaled_logits.argmax(dim=-1)
    scores = filter_top_k_top_p(scaled_logits, top_k, top_p)
    probs = torch.softmax(scores, dim=-1)
    # inverse-CDF draw: one uniform per row against the cumulative distribution. Exact like
    # torch.multinomial (right-side search never lands on a zero-probability token) and ~10x cheaper
    # on a large vocabulary, which matters because it runs once per generated token.
    cdf = probs.cumsum(dim=-1)
    u = torch.rand(cdf.shape[:-1] + (1,), generator=generator, device=cdf.device, dtype=cdf.dtype)
    idx = torch.searchsorted(cdf, u * cdf[..., -1:], right=True).squeeze(-1)
    return idx.clamp_(max=probs.shape[-1] - 1)
