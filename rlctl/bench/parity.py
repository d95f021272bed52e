"""``rlctl bench parity``: a platform's numerics against a CPU float64 reference of the same weights.

For each case (a profile's model on its platform's device, kernels and engines) and each dtype:

1. the rollout engine, in that dtype, samples ``batch`` responses of ``response_len`` tokens to
   seeded random prompts (temperature 1, no truncation, no early stop) and reports their log-probs
   from its own decoding path (KV cache, its kernels);
2. the training engine, computing in that dtype (fp32 master weights under mixed precision, as
   ``rlctl train`` builds it), scores the same sequences (log-probs, entropy), then takes one
   AdamW step on the surrogate loss of :mod:`.parity_reference` (gradient clipping off, so the
   gradients it reports are the raw ones);
3. the float64 reference scores the same sequences and takes the same step on the CPU
   (:mod:`.parity_reference`).

Reported per quantity: max/mean absolute and relative error and a PASS/WARN/FAIL verdict on one
named statistic against the tolerance of :mod:`rlctl.engines.numerics` (stated in the report with
its derivation); the train-vs-rollout log-prob gap (mean, p99, max); the per-token log-prob
differences for the histogram. The report's verdict per dtype is its worst quantity's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from rlctl.bench.parity_env import ParityCase, environment
from rlctl.bench.parity_errors import error_stats, gap_stats, grad_norm_stats, judged, masked, update_stats
from rlctl.bench.parity_reference import group_norms, reference_pass, surrogate_loss
from rlctl.devices import runtime_of
from rlctl.engines.hf_model import resolve_dtype
from rlctl.engines.numerics import (
    Tolerance,
    gap_tolerance,
    grad_tolerance,
    log_prob_tolerance,
    model_shape,
    vocab_size_of,
    worst,
)
from rlctl.engines.optim import OptimConfig

QUANTITIES = (
    "train_log_probs",
    "train_entropy",
    "loss",
    "grad_norms",
    "optimizer_step",
    "rollout_log_probs",
    "train_vs_rollout_gap",
)


@dataclass(frozen=True)
class ParitySettings:
    """The inputs every case is measured on."""

    dtypes: tuple[str, ...] = ("float32", "bfloat16")
    batch: int = 4
    prompt_len: int = 16
    response_len: int = 32
    seed: int = 0


def _prompts(settings: ParitySettings, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(settings.seed)
    ids = torch.randint(3, vocab, (settings.batch, settings.prompt_len), generator=g)
    return ids, torch.ones_like(ids)


def _advantages(settings: ParitySettings) -> torch.Tensor:
    g = torch.Generator().manual_seed(settings.seed + 1)
    return torch.randint(0, 2, (settings.batch,), generator=g).double() * 2 - 1


def build_engines(case: ParityCase, dtype: str, optim: OptimConfig, micro_batch: int):
    """The training and rollout engines ``rlctl train`` would build for this case and dtype."""
    from rlctl.engines.registry import get_engine

    model_type = _model_type(case.model_path)
    device = case.device.split(":")[0]
    low = resolve_dtype(dtype) != torch.float32
    train_cls = get_engine("train", model_type, "fsdp2", device)
    train = train_cls(
        case.model_path,
        device=case.device,
        dtype="float32",
        mixed_precision=dtype if low else None,
        attn_implementation=case.attn_implementation,
        optim=optim,
        micro_batch_size=micro_batch,
        share_prefix=False,
    )
    rollout_cls = get_engine("rollout", model_type, case.rollout_engine, device, case.platform)
    rollout = rollout_cls(case.model_path, device=case.device, dtype=dtype, **case.rollout_kwargs)
    return train, rollout


def _model_type(path: str) -> str:
    import json
    from pathlib import Path

    return json.loads((Path(path) / "config.json").read_text()).get("model_type", "*")


def _sync(device: str) -> None:
    runtime_of(device).synchronize()


def measure_dtype(case: ParityCase, dtype: str, settings: ParitySettings) -> dict:
    """Every quantity of one dtype against the float64 reference on the sequences it sampled."""
    optim = OptimConfig(lr=case.lr, weight_decay=case.weight_decay, grad_clip=0.0)
    start = time.perf_counter()
    train, rollout = build_engines(case, dtype, optim, micro_batch=settings.batch)
    sampled = _sample(rollout, settings, _vocab(case.model_path))
    rollout_lp = sampled.get("rollout_log_probs")
    reference = reference_pass(case.model_path, sampled, _advantages(settings), optim)
    layers, hidden = model_shape(train.model.config)
    seq_len = settings.prompt_len + settings.response_len
    tol = log_prob_tolerance(resolve_dtype(dtype), layers=layers, hidden=hidden, seq_len=seq_len)
    gap_tol = gap_tolerance((resolve_dtype(dtype),), layers=layers, hidden=hidden, seq_len=seq_len)
    tokens = settings.batch * seq_len
    grad_tol = grad_tolerance(
        resolve_dtype(dtype), layers=layers, hidden=hidden, seq_len=seq_len, tokens=tokens
    )
    mask = sampled["response_mask"].bool()

    scored = train.compute_log_prob(sampled, with_entropy=True)
    losses: list[float] = []
    adv = _advantages(settings)

    def loss_fn(outputs, mb, scale):
        loss = surrogate_loss(
            outputs["log_probs"], mb["response_mask"], adv.to(mb["responses"].device), scale.global_tokens
        )
        losses.append(float(loss.detach()))
        return loss, {}

    before = {n: p.detach().double().cpu().clone() for n, p in train.model.named_parameters()}
    train.train_batch(sampled, loss_fn)
    grads = {n: p.grad for n, p in train.model.named_parameters() if p.grad is not None}
    update = {n: p.detach().double().cpu() - before[n] for n, p in train.model.named_parameters()}
    _sync(case.device)

    quantities: dict[str, Any] = {
        "train_log_probs": judged(
            error_stats(masked(scored["log_probs"], mask), masked(reference["log_probs"], mask)),
            "mean_abs",
            tol,
        ),
        "train_entropy": judged(
            error_stats(masked(scored["entropy"], mask), masked(reference["entropy"], mask)), "mean_abs", tol
        ),
        "loss": judged(
            error_stats(torch.tensor(sum(losses)), torch.tensor(reference["loss"])), "mean_abs", tol
        ),
        "grad_norms": judged(
            grad_norm_stats(group_norms(grads), reference["grad_norms"]),
            "mean_rel",
            grad_tol,
        ),
        "optimizer_step": _judged_step(update_stats(update, reference["update"], before), grad_tol),
    }
    diffs: dict[str, list[float]] = {
        "train": (masked(scored["log_probs"], mask).double() - masked(reference["log_probs"], mask)).tolist()
    }
    if rollout_lp is None:
        quantities["rollout_log_probs"] = {
            "verdict": "SKIP",
            "why": f"{type(rollout).__name__} reports no log-probs",
        }
        quantities["train_vs_rollout_gap"] = dict(quantities["rollout_log_probs"])
    else:
        quantities["rollout_log_probs"] = judged(
            error_stats(masked(rollout_lp, mask), masked(reference["log_probs"], mask)), "mean_abs", tol
        )
        gap = gap_stats(masked(scored["log_probs"], mask), masked(rollout_lp, mask))
        quantities["train_vs_rollout_gap"] = judged(gap, "mean", gap_tol)
        diffs["rollout"] = (masked(rollout_lp, mask).double() - masked(reference["log_probs"], mask)).tolist()
    verdict = worst(q["verdict"] for q in quantities.values() if q["verdict"] != "SKIP")
    failing = [k for k, q in quantities.items() if q["verdict"] == "FAIL"]
    return {
        "dtype": dtype,
        "verdict": verdict,
        "failing": failing,
        "quantities": quantities,
        "log_prob_diffs": diffs,
        "tokens": int(mask.sum()),
        "seconds": time.perf_counter() - start,
        "kernels": {
            "train_engine": type(train).__name__,
            "train_attention": case.attn_implementation,
            "train_compute_dtype": str(train.compute_dtype or torch.float32).removeprefix("torch."),
            "rollout_engine": type(rollout).__name__,
            "rollout_attention": case.attn_implementation,
        },
    }


def _judged_step(stats: dict, grad_tol: Tolerance) -> dict:
    """The step's relative L1 error against the gradients' tolerance plus the rounding its float32
    master weights cannot avoid (``storage_rounding``, :func:`.parity_errors.update_stats`)."""
    rounding = stats["storage_rounding"]
    tol = Tolerance(
        grad_tol.passes + rounding,
        grad_tol.warns + rounding,
        f"sum|d - d_ref| / sum|d_ref| <= gradients' {grad_tol.passes:.3g} + float32 storage of the "
        f"stepped weights {rounding:.3g} ({grad_tol.why})",
    )
    return judged(stats, "rel_l1", tol)


def _sample(rollout, settings: ParitySettings, vocab: int) -> dict[str, torch.Tensor]:
    ids, mask = _prompts(settings, vocab)
    return rollout.generate(
        ids,
        mask,
        max_new_tokens=settings.response_len,
        temperature=1.0,
        eos_token_id=None,
        pad_token_id=0,
        seed=settings.seed,
    )


def _vocab(model_path: str) -> int:
    """The vocabulary size in the model's config (any engine: vLLM's holds no HF module)."""
    from transformers import AutoConfig

    return vocab_size_of(AutoConfig.from_pretrained(model_path))


def run_case(case: ParityCase, settings: ParitySettings) -> dict:
    """Every dtype of one case, each on the sequences its own rollout engine sampled."""
    start = time.perf_counter()
    rows = [measure_dtype(case, dt, settings) for dt in settings.dtypes]
    return {
        "case": case.to_dict(),
        "environment": environment(case.device),
        "settings": {**settings.__dict__, "dtypes": list(settings.dtypes)},
        "results": rows,
        "seconds": time.perf_counter() - start,
    }
