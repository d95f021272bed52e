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
  fraction of this host's measured fp32 matrix multiply (``host_matmul_gflops``, 1024^3; the rate
  at the model's MLP shape is reported beside it).
- **per-stage work** (every row): medians of the loop's ``time/<stage>`` metrics, each stage's
  model FLOPs over the step's real tokens, its fraction of the host's GEMM rate measured right
  before that run (the row's ``host_matmul_gflops``: the host's load drifts over a bench) and its
  floor at that rate (:mod:`rlctl.bench.step_flops`); in the off-policy modes ``gen`` and ``reward`` run on the
  rollout thread, overlapped, and ``wait_rollout`` is what the trainer waited for them. TRL's
  step splits into ``gen`` (its generate-and-score method) and ``update_actor`` (the rest).
- **bare model** (on CPU): the profile's model as plain transformers at the first rlctl run's
  shapes, with nothing around it (:mod:`rlctl.bench.step_bare`), and every row's s/step over it.
- **seeds** (``--seeds k``): every row runs k times, ``run.seed`` = the profile's + 0..k-1; the
  row holds medians over the seeds (:mod:`rlctl.bench.step_seeds`), each seed's values beside.
- **baseline** (``--baseline DIR``): the same bench run by the rlctl checkout in DIR, rows
  ``baseline-<mode>`` and ``<mode>_s_per_step_vs_baseline`` (:mod:`rlctl.bench.step_baseline`).

TRL (optional ``bench`` extra, ``trl==1.16.0``): :func:`run_trl` states every GRPOConfig setting
it uses; they mirror the profile (read from trl/trainer/grpo_config.py of that release).
"""

from __future__ import annotations

import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rlctl.bench.step_bare import bare_model_ratios, bare_model_shape, measure_bare_model
from rlctl.bench.step_baseline import run_baseline
from rlctl.bench.step_common import (
    MODES,
    VARIANTS,
    StepBenchConfig,
    bench_profile,
    host_matmul_gflops,
    shipped_profile,
    summarise_metrics,
)
from rlctl.bench.step_flops import ModelShape, model_shape, model_shape_gemm, stage_work
from rlctl.bench.step_seeds import accuracy_at_equal_time, combine_seeds, equal_time
from rlctl.bench.step_trl import run_trl


# -- rlctl -------------------------------------------------------------------------------------------
def run_rlctl(cfg: StepBenchConfig, mode: str, out: Path, params: int, seed_index: int = 0) -> dict[str, Any]:
    """Train ``mode`` on the profile (seed ``seed_index``) and summarise its metrics.jsonl, the
    host's GEMM rate measured right before the run (the host's load drifts over a bench)."""
    from rlctl.trainer.run import run_dir_for, train

    profile = bench_profile(cfg, mode, out, seed_index)
    peak = host_matmul_gflops()
    try:
        train(profile, resume="never")
    finally:
        if profile.cluster.backend == "ray":
            _stop_ray()  # each run starts from a fresh cluster (placement groups freed, no warm caches)
    return summarise_metrics(
        mode,
        run_dir_for(profile, None) / "metrics.jsonl",
        sequences=profile.sequences_per_step,
        params=params,
        peak_gflops=peak,
        target=cfg.target,
    )


def _stop_ray() -> None:
    try:
        import ray
    except ImportError:
        return
    if ray.is_initialized():
        ray.shutdown()


# -- the bench ---------------------------------------------------------------------------------------
def run_step_bench(cfg: StepBenchConfig) -> dict[str, Any]:
    """Every requested run over every seed, the baseline's, then the ratios and (with an out_dir)
    the PNG of the curves."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(cfg.out_dir or tmp).resolve()
        out.mkdir(parents=True, exist_ok=True)
        from rlctl.trainer.setup.models import materialize_model

        base = bench_profile(cfg, "sync", out)
        model_dir = materialize_model(base.model.path, out / "params-base", seed=base.run.seed)
        shape = model_shape(model_dir)
        params = shape.matmul_params
        peak = host_matmul_gflops()
        model_gemm = model_shape_gemm(shape)
        seeds = [base.run.seed + i for i in range(cfg.seeds)]
        rows = []
        for mode in cfg.modes:
            runs = [run_rlctl(cfg, mode, out, params, i) for i in range(cfg.seeds)]
            rows.append(combine_seeds(mode, runs, seeds))
        if cfg.against_trl:
            rows.append(combine_seeds("trl", [run_trl(cfg, out, params, i) for i in range(cfg.seeds)], seeds))
        if cfg.baseline:
            by_mode = run_baseline(cfg, out, base.run.seed, sequences=base.sequences_per_step, params=params)
            rows += [combine_seeds(f"baseline-{m}", runs, seeds) for m, runs in by_mode.items()]
        for r in rows:
            add_stage_work(r, base, shape)
        bare = bare_model(rows, base, model_dir)
        equal_s = equal_time(rows)
        for r in rows:
            r["accuracy_at_equal_time"] = accuracy_at_equal_time(r, equal_s)
        result = {
            "config": {**asdict(cfg), "profile": str(cfg.profile or shipped_profile())},
            "seeds": seeds,
            "equal_time_s": equal_s,
            "shape": {
                "prompts_per_step": base.trainer.prompts_per_step,
                "n": base.rollout.n,
                "lr": base.actor.lr,
                "max_new_tokens": base.rollout.max_new_tokens,
                "val_prompts": cfg.val_size or base.data.val_size,
            },
            "host_matmul_gflops": peak,
            "host_matmul_model_shape": model_gemm,
            "matmul_params": params,
            "rows": rows,
            "bare_model": bare,
            "ratios": {**ratios(rows), **(bare_model_ratios(rows, bare) if bare else {})},
        }
        if cfg.out_dir:
            result["png"] = plot_curves(rows, out / "bench_step.png", cfg.target)
        return result


def bare_model(rows: list[dict[str, Any]], profile, model_dir) -> dict[str, Any] | None:
    """:mod:`rlctl.bench.step_bare` at the first rlctl row's shapes, on the threads the loops'
    workers have (``platform.cpu_threads``, or: sync's colocated worker the host's cores over the
    node's ranks, the off-policy sides their split of them), its update over the share of the groups
    that run forwarded (``update_token_frac``); None without an rlctl row or off CPU (it runs on
    the host's cores)."""
    import os

    from rlctl.platforms.resolve import resolve_platform
    from rlctl.trainer.workers.roles import split_cpu_threads

    ours = [r for r in rows if r["name"] in MODES]
    if not ours or resolve_platform(profile.platform.vendor).device_type != "cpu":
        return None

    prompt_tokens, response_tokens = bare_model_shape(ours[0], profile.sequences_per_step)
    cores, ranks, fixed = os.cpu_count() or 1, profile.cluster.devices_per_node, profile.platform.cpu_threads
    return measure_bare_model(
        model_dir,
        prompts=profile.trainer.prompts_per_step,
        n=profile.rollout.n,
        prompt_tokens=prompt_tokens,
        response_tokens=response_tokens,
        update_prompts=max(
            1, round(profile.trainer.prompts_per_step * (ours[0]["update_token_frac"] or 1.0))
        ),
        threads=fixed or max(1, cores // ranks),
        split_threads=(fixed, fixed) if fixed else split_cpu_threads(cores, ranks),
    )


def add_stage_work(row: dict[str, Any], profile, shape: ModelShape) -> None:
    """``stage_work`` of the row (its median seconds, tokens and GEMM rate) and of each of its
    seeds (its own GEMM rate, measured right before its run)."""
    critic = shape.matmul_params - shape.head_params + shape.hidden  # the value head: hidden -> 1
    kw = {
        "params": shape.matmul_params,
        "critic_params": critic if not profile.critic.path else None,
        "actor_epochs": profile.actor.ppo_epochs,
        "critic_epochs": profile.critic.ppo_epochs,
    }
    row["stage_work"] = stage_work(
        row["stages_s"],
        row["tokens_per_step"] or 0.0,
        peak_gflops=row["host_matmul_gflops"],
        update_token_frac=row.get("update_token_frac", 1.0),
        **kw,
    )
    for s in row["seeds"]:
        s["stage_work"] = stage_work(
            s["stages_s"],
            s.get("tokens_per_step") or 0.0,
            peak_gflops=s["host_matmul_gflops"],
            update_token_frac=s.get("update_token_frac", 1.0),
            **kw,
        )


def ratios(rows: list[dict[str, Any]]) -> dict[str, float]:
    """samples/s against sync (and against TRL), time to sustained target against them, and each
    mode's s/step against the baseline's same mode."""
    by = {r["name"]: r for r in rows}
    ours = [r for r in rows if not r["name"].startswith("baseline-")]
    out: dict[str, float] = {}
    for ref in ("sync", "trl"):
        if ref not in by:
            continue
        for r in ours:
            if r["name"] != ref:
                out[f"{r['name']}_samples_per_s_vs_{ref}"] = r["samples_per_s"] / by[ref]["samples_per_s"]
                a, b = r["time_to_sustained_s"], by[ref]["time_to_sustained_s"]
                if a is not None and b:
                    out[f"{r['name']}_time_to_sustained_vs_{ref}"] = a / b
    for r in ours:  # a switch against the mode it switches on
        if r["name"] in VARIANTS and "async" in by:
            out[f"{r['name']}_samples_per_s_vs_async"] = r["samples_per_s"] / by["async"]["samples_per_s"]
    for r in ours:
        base = by.get(f"baseline-{r['name']}")
        if base is not None:
            out[f"{r['name']}_s_per_step_vs_baseline"] = r["s_per_step"] / base["s_per_step"]
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
    for i, r in enumerate(rows):
        for j, seed in enumerate(r["seeds"]):  # every seed's curve, one colour per row
            xs = [p["train_s"] for p in seed["curve"]]
            ys = [p["accuracy"] for p in seed["curve"]]
            label = f"{r['name']} ({r['s_per_step']:.3f} s/step)" if j == 0 else None
            ax.plot(xs, ys, marker="o", color=f"C{i}", alpha=1.0 if j == 0 else 0.5, label=label)
    ax.axhline(target, color="grey", linestyle="--", linewidth=0.8)
    ax.set_xlabel("training seconds (evaluation excluded)")
    ax.set_ylabel("held-out greedy accuracy")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return str(path)
