"""Log-probs and entropy of tokens under a temperature: the one formula both engines use.

Training and rollout must agree on what "the log-prob of a sampled token" means (TRL #4159 was a
temperature applied in one place and not the other). Both engines call these helpers, so the
definition lives once: ``log_softmax(logits / temperature)`` over the full vocabulary, no top-k or
top-p truncation.
"""

from __future__ import annotations

import torch


def scaled_log_softmax(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """``log_softmax(logits / temperature)`` in fp32 over the last dim."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    return torch.log_softmax(logits, dim=-1)


def token_log_probs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Log-prob of ``tokens`` (..., ) under ``logits`` (..., V) scaled by ``temperature``."""
    logp = scaled_log_softmax(logits, temperature)
    return logp.gather(-1, tokens.unsqueeze(-1).long()).squeeze(-1)


def token_log_probs_and_entropy(
    logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob of ``tokens`` and entropy of the distribution, both under ``temperature``."""
    logp = scaled_log_softmax(logits, temperature)
    picked = logp.gather(-1, tokens.unsqueeze(-1).long()).squeeze(-1)
    entropy = -(logp.exp() * logp).sum(-1)
    return picked, entropy


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """verl's convention: ``cumsum(mask) - 1`` clipped at 0 (left padding gets position 0)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def response_logits(logits: torch.Tensor, response_length: int) -> torch.Tensor:
    """Logits that predict the response tokens: positions ``P-1 .. P+R-2`` of a (B, P+R, V) output."""
    return logits[:, -response_length - 1 : -1]
