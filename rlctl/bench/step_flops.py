"""The work of each stage of a step in ``rlctl bench step``: model FLOPs, the fraction of this
host's measured matmul rate a stage reaches, and the floor it could reach at that rate.

The count is the standard model-FLOPs one: 2 x matmul parameters x tokens per forward pass, over
the real (unpadded) prompt + response tokens of the step, a backward pass counting twice a
forward. Generation is one forward over every prompt and generated token (a KV cache makes each
token one pass); the actor/critic update is 3 passes per epoch; each log-prob or value pass is 1.
Work the count does not see (attention's own products, a prompt's prefill shared by its ``n``
samples) can put a stage's fraction above what its matrix multiplies alone would allow.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

# forward passes per token of each stage that runs the model; the rest (reward, adv, sync, ...)
# count no model FLOPs
FORWARD_PASSES = {"gen": 1, "old_log_prob": 1, "ref": 1, "values": 1, "update_actor": 3, "update_critic": 3}
CRITIC_STAGES = ("values", "update_critic")
MODEL_SHAPE_TOKENS = 1024  # rows of the model-shape GEMM: about one micro-batch of tokens


@dataclass(frozen=True)
class ModelShape:
    """What the FLOP count needs of a checkpoint."""

    matmul_params: int  # parameters in a matrix multiply per token (the tied LM head once)
    head_params: int  # the LM head's share (a critic replaces it with a one-output value head)
    hidden: int
    intermediate: int


def model_shape(model_path: str) -> ModelShape:
    """Parameters that take part in a matrix multiply per token: all but the input embedding table
    (a lookup), which counts once as the LM head when the two are tied."""
    from rlctl.engines.hf_model import load_causal_lm

    model = load_causal_lm(model_path, dtype="float32")
    total = sum(p.numel() for p in model.parameters())
    embed = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    tied = head is not None and head.weight is embed
    config = model.config
    hidden = int(getattr(config, "hidden_size", embed.shape[1]))
    return ModelShape(
        matmul_params=total if tied else total - embed.numel(),
        head_params=head.weight.numel() if head is not None else 0,
        hidden=hidden,
        intermediate=int(getattr(config, "intermediate_size", None) or 4 * hidden),
    )


def gemm_gflops(m: int, k: int, n: int, repeats: int = 5) -> float:
    """Best fp32 ``[m, k] @ [k, n]`` throughput of this host with the current thread count (GFLOP/s)."""
    a, b = torch.randn(m, k), torch.randn(k, n)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - start)
    return 2 * m * k * n / best / 1e9


def model_shape_gemm(shape: ModelShape) -> dict[str, Any]:
    """The GEMM rate at the model's MLP shape: ``MODEL_SHAPE_TOKENS`` tokens x hidden -> intermediate."""
    m, k, n = MODEL_SHAPE_TOKENS, shape.hidden, shape.intermediate
    return {"m": m, "k": k, "n": n, "gflops": gemm_gflops(m, k, n)}


def stage_work(
    stages_s: dict[str, float],
    tokens: float,
    *,
    params: int,
    peak_gflops: float,
    critic_params: int | None = None,
    actor_epochs: int = 1,
    critic_epochs: int = 1,
    update_token_frac: float = 1.0,
) -> dict[str, dict[str, float | None]]:
    """Per stage: ``seconds``, ``gflop``, ``fraction`` (of ``peak_gflops``) and ``floor_s`` (the
    seconds its FLOPs take at ``peak_gflops``); stages that run no model have None for the rest.
    ``update_token_frac`` is the share of the tokens the actor update forwarded (rows without a
    gradient are skipped)."""
    out: dict[str, dict[str, float | None]] = {}
    for name, seconds in stages_s.items():
        passes = FORWARD_PASSES.get(name)
        if passes is None:
            out[name] = {"seconds": seconds, "gflop": None, "fraction": None, "floor_s": None}
            continue
        critic = name in CRITIC_STAGES
        p = (critic_params if critic_params is not None else params) if critic else params
        epochs = (critic_epochs if critic else actor_epochs) if name.startswith("update") else 1
        share = update_token_frac if name == "update_actor" else 1.0
        flops = 2.0 * p * tokens * passes * epochs * share
        rate = peak_gflops * 1e9
        out[name] = {
            "seconds": seconds,
            "gflop": flops / 1e9,
            "fraction": flops / seconds / rate if seconds > 0 and rate else None,
            "floor_s": flops / rate if rate else None,
        }
    return out
