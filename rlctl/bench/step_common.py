"""What every row of ``rlctl bench step`` shares: its config, the profile each run trains, the
host's measured fp32 matmul rate, and the arithmetic of the report (time to sustained target,
accuracy at equal time, the per-run summary, a run's metrics.jsonl read into one)."""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlctl.bench.step_flops import gemm_gflops

WARMUP = 3
SUSTAIN = 3
MODES = ("sync", "one_step_off", "async")
# rows beyond the three modes: a mode with a switch on (the long-tail task's rows,
# docs/async-rollouts.md); each is the named mode's profile plus these keys
VARIANTS = {
    "async-swap": ("trainer.mode=async", 'trainer.partial_rollouts="swap"'),
    "async-carry": ("trainer.mode=async", 'trainer.partial_rollouts="carry"'),
    "async-delta": ("trainer.mode=async", "rollout.delta_sync=true"),
}
ROWS = (*MODES, *VARIANTS)


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
    seeds: int = 1  # every row runs with run.seed = the profile's seed + 0 .. seeds-1
    baseline: str = ""  # a checkout of another rlctl version whose rows run alongside (step_baseline)
    target: float = 0.8
    out_dir: str = ""  # runs and the PNG; empty: a temporary directory (the PNG is then dropped)
    overrides: tuple[str, ...] = field(default_factory=tuple)


# -- measurements ------------------------------------------------------------------------------------
def host_matmul_gflops(size: int = 1024, repeats: int = 5) -> float:
    """Best fp32 ``torch.mm`` throughput of this host at ``size``^3 with the current thread count
    (GFLOP/s): the headline rate every fraction of the report is of."""
    return gemm_gflops(size, size, size, repeats)


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
        "tokens_per_step": tok,
        "host_matmul_gflops": peak_gflops,
    }


def summarise_metrics(
    name: str, metrics_path: Path, *, sequences: int, params: int, peak_gflops: float, target: float
) -> dict[str, Any]:
    """One run's metrics.jsonl as a :func:`summarise` row. Tokens of a step are the real
    (unpadded) prompt + response tokens the loop counted: ``perf/tokens_per_s`` x ``time/step``."""
    records: dict[int, dict] = {}
    for line in metrics_path.read_text().splitlines():
        r = json.loads(line)
        records.setdefault(r["step"], {}).update(r)
    steps = [records[s] for s in sorted(records) if s > 0]
    curve = [
        (records[s].get("train_time_s", 0.0) if s > 0 else 0.0, records[s]["val/accuracy"])
        for s in sorted(records)
        if "val/accuracy" in records[s]
    ]
    # the update forwards and backwards only the rows with a gradient (actor.skip_zero_advantage):
    # its FLOPs are 3x that share of the step's tokens, plus one forward of the skipped rows (their
    # metrics, actor/metrics_token_frac)
    timed = steps[WARMUP:] or steps
    update_frac = statistics.median(r.get("actor/forwarded_token_frac", 1.0) for r in timed) if timed else 1.0
    metrics_frac = statistics.median(r.get("actor/metrics_token_frac", 0.0) for r in timed) if timed else 0.0
    stages: dict[str, list[float]] = {}
    for r in steps:
        for k, v in r.items():
            if k.startswith("time/") and k not in ("time/step", "time/val"):
                stages.setdefault(k[5:], []).append(v)
    row = summarise(
        name,
        [r["time/step"] for r in steps],
        curve,
        sequences=sequences,
        tokens=[r["perf/tokens_per_s"] * r["time/step"] for r in steps],
        passes=1 + 3 * update_frac + metrics_frac + ("old_log_prob" in stages) + ("ref" in stages),
        params=params,
        peak_gflops=peak_gflops,
        target=target,
        stages=stages,
    )
    row["update_token_frac"] = update_frac
    lengths = [r["response_length/mean"] for r in timed if "response_length/mean" in r]
    row["response_tokens"] = statistics.median(lengths) if lengths else None
    if any("async/staleness_mean" in r for r in steps):
        row["staleness_mean"] = statistics.mean(r.get("async/staleness_mean", 0.0) for r in steps)
        row["staleness_max"] = max(r.get("async/staleness_max", 0.0) for r in steps)
    return row


def bench_profile(cfg: StepBenchConfig, mode: str, out: Path, seed_index: int = 0):
    """The profile a run trains: ``cfg``'s shape on top of the profile file, ``run.seed`` the
    file's seed + ``seed_index``."""
    from rlctl.profile import load_profile

    sets = [
        *VARIANTS.get(mode, (f"trainer.mode={mode}",)),
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
    profile = load_profile(cfg.profile or shipped_profile(), [*sets, *cfg.overrides])
    if seed_index:
        seed = profile.run.seed + seed_index
        sets += [f"run.seed={seed}", f"run.name=rlctl-{mode}-seed{seed}"]
        profile = load_profile(cfg.profile or shipped_profile(), [*sets, *cfg.overrides])
    return profile
