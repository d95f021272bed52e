"""``rlctl bench step``: rlctl's sync, one_step_off and async loops (and TRL's GRPOTrainer) side by side.

Every run trains the same checkpoint with the same profile (by default the shipped
``profiles/tiny-cpu.toml``: ``assets/tiny-1m-addition-sft``, two-digit addition, exact-answer
reward, 24 prompts x 4 samples, lr 2e-4), one after the other in this process, and is measured
the same way:

- **s/step**: median wall seconds of a training step after the first ``WARMUP`` steps; samples/s
  is sequences per step over it. Validation is never on the clock.
- **accuracy curve**: greedy held-out accuracy on the profile's validation prompts against the
  training seconds spent so far; **time to sustained target** is the training time of the first
  validation after which every later one (at least ``SUSTAIN`` of them, itself included) stays at
  or above ``target``; **accuracy at equal time** is each run's latest validation at the
  training seconds every run reached (the shortest run's last validation).
- **matmul fraction**: FLOP-counted work of a step (2 x matmul parameters x tokens per forward
  pass: generation 1, actor update 3, each extra log-prob pass 1) over its seconds, as a
  fraction of this host's measured fp32 matrix multiply (``host_matmul_gflops``).
- **per-stage seconds** (rlctl): medians of the loop's ``time/<stage>`` metrics; in the off-policy
  modes ``gen`` and ``reward`` run on the rollout thread, overlapped, and ``wait_rollout`` is what
  the trainer waited for them.

TRL (optional ``bench`` extra, ``trl==1.16.0``): :func:`run_trl` states every GRPOConfig setting
it uses; they mirror the profile (read from trl/trainer/grpo_config.py of that release).
"""

from __future__ import annotations

import json
import statistics
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rlctl.bench.step_common import (
    StepBenchConfig,
    accuracy_at,
    bench_profile,
    host_matmul_gflops,
    matmul_params,
    shipped_profile,
    summarise,
)
from rlctl.bench.step_trl import run_trl


# -- rlctl -------------------------------------------------------------------------------------------
def run_rlctl(cfg: StepBenchConfig, mode: str, out: Path, params: int, peak: float) -> dict[str, Any]:
    """Train ``mode`` on the profile and summarise its metrics.jsonl."""
    from rlctl.trainer.run import run_dir_for, train

    profile = bench_profile(cfg, mode, out)
    try:
        train(profile, resume="never")
    finally:
        if profile.cluster.backend == "ray":
            _stop_ray()  # each run starts from a fresh cluster (placement groups freed, no warm caches)
    records: dict[int, dict] = {}
    for line in (run_dir_for(profile, None) / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        records.setdefault(r["step"], {}).update(r)
    steps = [records[s] for s in sorted(records) if s > 0]
    curve = [
        (records[s].get("train_time_s", 0.0) if s > 0 else 0.0, records[s]["val/accuracy"])
        for s in sorted(records)
        if "val/accuracy" in records[s]
    ]
    stages: dict[str, list[float]] = {}
    for r in steps:
        for k, v in r.items():
            if k.startswith("time/") and k not in ("time/step", "time/val"):
                stages.setdefault(k[5:], []).append(v)
    tokens = [r["perf/tokens_per_s"] * r["time/step"] for r in steps]
    passes = 1 + 3 + ("old_log_prob" in stages) + ("ref" in stages)
    row = summarise(
        mode,
        [r["time/step"] for r in steps],
        curve,
        sequences=profile.sequences_per_step,
        tokens=tokens,
        passes=passes,
        params=params,
        peak_gflops=peak,
        target=cfg.target,
        stages=stages,
    )
    if mode != "sync":
        row["staleness_mean"] = statistics.mean(r.get("async/staleness_mean", 0.0) for r in steps)
        row["staleness_max"] = max(r.get("async/staleness_max", 0.0) for r in steps)
    return row


def _stop_ray() -> None:
    try:
        import ray
    except ImportError:
        return
    if ray.is_initialized():
        ray.shutdown()


# -- the bench ---------------------------------------------------------------------------------------
def run_step_bench(cfg: StepBenchConfig) -> dict[str, Any]:
    """Every requested run, then the ratios and (with an out_dir) the PNG of the curves."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(cfg.out_dir or tmp)
        out.mkdir(parents=True, exist_ok=True)
        from rlctl.trainer.setup.models import materialize_model

        base = bench_profile(cfg, "sync", out)
        params = matmul_params(materialize_model(base.model.path, out / "params-base", seed=base.run.seed))
        peak = host_matmul_gflops()
        rows = [run_rlctl(cfg, mode, out, params, peak) for mode in cfg.modes]
        if cfg.against_trl:
            rows.append(run_trl(cfg, out, params, peak))
        equal_s = equal_time(rows)
        for r in rows:
            r["accuracy_at_equal_time"] = accuracy_at(
                [(p["train_s"], p["accuracy"]) for p in r["curve"]], equal_s
            )
        result = {
            "config": {**asdict(cfg), "profile": str(cfg.profile or shipped_profile())},
            "equal_time_s": equal_s,
            "shape": {
                "prompts_per_step": base.trainer.prompts_per_step,
                "n": base.rollout.n,
                "lr": base.actor.lr,
                "max_new_tokens": base.rollout.max_new_tokens,
                "val_prompts": cfg.val_size or base.data.val_size,
            },
            "host_matmul_gflops": peak,
            "matmul_params": params,
            "rows": rows,
            "ratios": ratios(rows),
        }
        if cfg.out_dir:
            result["png"] = plot_curves(rows, out / "bench_step.png", cfg.target)
        return result


def equal_time(rows: list[dict[str, Any]]) -> float:
    """The training seconds every run reached: the shortest run's last validation."""
    ends = [r["curve"][-1]["train_s"] for r in rows if r["curve"]]
    return min(ends) if ends else 0.0


def ratios(rows: list[dict[str, Any]]) -> dict[str, float]:
    """samples/s against sync (and against TRL) and time to sustained target against TRL."""
    by = {r["name"]: r for r in rows}
    out: dict[str, float] = {}
    for ref in ("sync", "trl"):
        if ref not in by:
            continue
        for r in rows:
            if r["name"] != ref:
                out[f"{r['name']}_samples_per_s_vs_{ref}"] = r["samples_per_s"] / by[ref]["samples_per_s"]
                a, b = r["time_to_sustained_s"], by[ref]["time_to_sustained_s"]
                if a is not None and b:
                    out[f"{r['name']}_time_to_sustained_vs_{ref}"] = a / b
    return out


def plot_curves(rows: list[dict[str, Any]], path: Path, target: float) -> str | None:
    """Held-out accuracy against training seconds, one line per run; None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    for r in rows:
        xs = [p["train_s"] for p in r["curve"]]
        ys = [p["accuracy"] for p in r["curve"]]
        ax.plot(xs, ys, marker="o", label=f"{r['name']} ({r['s_per_step']:.3f} s/step)")
    ax.axhline(target, color="grey", linestyle="--", linewidth=0.8)
    ax.set_xlabel("training seconds (evaluation excluded)")
    ax.set_ylabel("held-out greedy accuracy")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return str(path)
