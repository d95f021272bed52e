"""What every row of ``rlctl bench step`` shares: its config, the profile each run trains, the
host's measured fp32 matmul rate, and the arithmetic of the report (time to sustained target,
accuracy at equal time, the per-run summary)."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

WARMUP = 3
SUSTAIN = 3
MODES = ("sync", "one_step_off", "async")


def shipped_profile() -> Path:
    return Path(__file__).resolve().parents[2] / "profiles" / "tiny-cpu.toml"


@dataclass(frozen=True)
class StepBenchConfig:
    profile: str = ""  # empty: the shipped profiles/tiny-cpu.toml
    steps: int = 200
    val_every: int = 20
    modes: tuple[str, ...] = MODES
    against_trl: bool = False
    prompts_per_step: int | None = None
    n: int | None = None
    lr: float | None = None
    val_size: int | None = None
    backend: str | None = None
    max_staleness: int = 1
    target: float = 0.8
    out_dir: str = ""  # runs and the PNG; empty: a temporary directory (the PNG is then dropped)
    overrides: tuple[str, ...] = field(default_factory=tuple)


# -- measurements ------------------------------------------------------------------------------------
def host_matmul_gflops(size: int = 1024, repeats: int = 5) -> float:
    """Best fp32 ``torch.mm`` throughput of this host with the current thread count (GFLOP/s)."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best / 1e9


def matmul_params(model_path: str) -> int:
    """Parameters that take part in a matrix multiply per token: all but the input embedding table
    (a lookup), which counts once as the LM head when the two are tied."""
    from rlctl.engines.hf_model import load_causal_lm

    model = load_causal_lm(model_path, dtype="float32")
    total = sum(p.numel() for p in model.parameters())
    embed = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    tied = head is not None and head.weight is embed
    return total if tied else total - embed.numel()


def sustained_time(curve: list[tuple[float, float]], target: float) -> float | None:
    """Training seconds of the first validation from which every later one (at least SUSTAIN,
    itself included) stays >= target; None when the run never sustains it."""
    for i, (t, _) in enumerate(curve):
        rest = [acc for _, acc in curve[i:]]
        if len(rest) >= SUSTAIN and all(acc >= target for acc in rest):
            return t
    return None


def accuracy_at(curve: list[tuple[float, float]], seconds: float) -> float | None:
    """The latest validated accuracy at or before ``seconds`` of training."""
    seen = [acc for t, acc in curve if t <= seconds + 1e-9]
    return seen[-1] if seen else None


def summarise(
    name: str,
    step_s: list[float],
    curve: list[tuple[float, float]],
    *,
    sequences: int,
    tokens: list[float],
    passes: float,
    params: int,
    peak_gflops: float,
    target: float,
    stages: dict[str, list[float]] | None = None,
) -> dict[str, Any]:
    """One row of the bench: medians over the steps after WARMUP, the curve and what follows from it."""
    timed = step_s[WARMUP:] or step_s
    med = statistics.median(timed)
    tok = statistics.median(tokens[WARMUP:] or tokens) if tokens else 0.0
    flops = 2.0 * params * tok * passes
    return {
        "name": name,
        "steps": len(step_s),
        "s_per_step": med,
        "samples_per_s": sequences / med,
        "train_s": sum(step_s),
        "curve": [{"train_s": t, "accuracy": a} for t, a in curve],
        "final_accuracy": curve[-1][1] if curve else None,
        "time_to_sustained_s": sustained_time(curve, target),
        "step_gflop": flops / 1e9,
        "matmul_fraction": flops / med / (peak_gflops * 1e9) if peak_gflops else None,
        "stages_s": {k: statistics.median(v[WARMUP:] or v) for k, v in sorted((stages or {}).items())},
    }


def bench_profile(cfg: StepBenchConfig, mode: str, out: Path):
    from rlctl.profile import load_profile

    sets = [
        f"trainer.mode={mode}",
        f"trainer.steps={cfg.steps}",
        f"trainer.val_every={cfg.val_every}",
        f"trainer.max_staleness={cfg.max_staleness}",
        "trainer.save_every=0",
        "trainer.export_hf=false",
        "trainer.loggers=['jsonl']",
        "trainer.log_samples=0",
        f"run.output_dir={out}",
        f"run.name=rlctl-{mode}",
    ]
    for key, value in (
        ("trainer.prompts_per_step", cfg.prompts_per_step),
        ("rollout.n", cfg.n),
        ("actor.lr", cfg.lr),
        ("data.val_size", cfg.val_size),
        ("cluster.backend", cfg.backend),
    ):
        if value is not None:
            sets.append(f"{key}={value}")
    return load_profile(cfg.profile or shipped_profile(), [*sets, *cfg.overrides])
