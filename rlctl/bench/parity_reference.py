"""The exact side of ``rlctl bench parity``: the same weights and inputs in float64 on the CPU.

Everything is computed here, not through the engines under test: transformers' eager attention in
float64, ``log_softmax`` in float64, the loss by hand, ``torch.optim.AdamW`` on float64 copies. A
kernel or engine bug on the device side therefore cannot hide in its own reference.

The loss both sides compute is a policy-gradient surrogate with fixed per-sequence advantages
``a_i`` (+1 or -1, seeded): ``sum_i,t(-a_i * log p_it * m_it) / sum(m)``, a token-mean over the
response mask, so its gradient reaches every layer the way an RL update does.
"""

from __future__ import annotations

import re

import torch

from rlctl.engines.hf_model import load_causal_lm
from rlctl.engines.optim import OptimConfig

LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def layer_of(name: str) -> str:
    """The group a parameter's gradient norm is reported under: ``layer 3``, ``embed_tokens``, ..."""
    found = LAYER.search(name)
    if found:
        return f"layer {int(found.group(1))}"
    parts = [p for p in name.split(".") if p not in ("model", "weight", "bias")]
    return parts[0] if parts else name


def group_norms(named_grads: dict[str, torch.Tensor]) -> dict[str, float]:
    """Per-group L2 norms of gradients (float64 accumulation), in first-seen order."""
    squares: dict[str, float] = {}
    for name, grad in named_grads.items():
        key = layer_of(name)
        squares[key] = squares.get(key, 0.0) + float(grad.double().pow(2).sum())
    return {k: v**0.5 for k, v in squares.items()}


def surrogate_loss(log_probs: torch.Tensor, mask: torch.Tensor, advantages: torch.Tensor, tokens: int):
    """The bench's loss (module docstring): token-mean of ``-a * log p`` over ``tokens`` tokens."""
    return (-(advantages[:, None].to(log_probs.dtype)) * log_probs * mask.to(log_probs.dtype)).sum() / tokens


def response_log_probs(model, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs and entropy of the response tokens, in float64, with the graph kept."""
    resp = batch["responses"]
    logits = model(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        position_ids=batch["position_ids"],
        use_cache=False,
    ).logits[:, -resp.shape[1] - 1 : -1]
    logp = torch.log_softmax(logits.double(), dim=-1)
    picked = logp.gather(-1, resp.long().unsqueeze(-1)).squeeze(-1)
    entropy = -(logp.exp() * logp).sum(-1)
    return picked, entropy


def reference_pass(
    model_path: str, batch: dict[str, torch.Tensor], advantages: torch.Tensor, optim: OptimConfig
) -> dict:
    """Log-probs, entropy, loss, per-group gradient norms and one AdamW step, all in float64.

    Returns host tensors: ``log_probs``/``entropy`` (B, R), ``loss`` (float), ``grad_norms``
    (group -> float), and ``update`` (name -> float64 parameter change of the step).
    """
    model = load_causal_lm(model_path, dtype=torch.float64, attn_implementation="eager").eval()
    batch = {k: v.cpu() for k, v in batch.items()}
    log_probs, entropy = response_log_probs(model, batch)
    mask = batch["response_mask"]
    loss = surrogate_loss(log_probs, mask, advantages.cpu(), int(mask.sum()))
    loss.backward()
    named = dict(model.named_parameters())
    grads = {n: p.grad.detach().clone() for n, p in named.items() if p.grad is not None}
    before = {n: p.detach().clone() for n, p in named.items()}
    opt = torch.optim.AdamW(
        list(named.values()), lr=optim.lr, betas=optim.betas, eps=optim.eps, weight_decay=optim.weight_decay
    )
    opt.step()
    update = {n: (p.detach() - before[n]) for n, p in named.items()}
    model.zero_grad(set_to_none=True)
    return {
        "log_probs": log_probs.detach(),
        "entropy": entropy.detach(),
        "loss": float(loss.detach()),
        "grad_norms": group_norms(grads),
        "update": update,
    }
