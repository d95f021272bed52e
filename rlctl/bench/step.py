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

import contextlib
import json
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
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


# -- rlctl -------------------------------------------------------------------------------------------
def _profile(cfg: StepBenchConfig, mode: str, out: Path):
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


def run_rlctl(cfg: StepBenchConfig, mode: str, out: Path, params: int, peak: float) -> dict[str, Any]:
    """Train ``mode`` on the profile and summarise its metrics.jsonl."""
    from rlctl.trainer.run import run_dir_for, train

    profile = _profile(cfg, mode, out)
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


# -- TRL ---------------------------------------------------------------------------------------------
def trl_settings(profile) -> dict[str, Any]:
    """GRPOConfig keyword arguments mirroring the profile (trl 1.16.0, trl/trainer/grpo_config.py):
    one generation of prompts x n completions per optimiser step, GRPO group-std advantages,
    token-mean loss ("dapo": normalised by the batch's active tokens), no KL, constant lr."""
    p = profile
    return {
        "per_device_train_batch_size": p.sequences_per_step,
        "gradient_accumulation_steps": 1,
        "num_generations": p.rollout.n,
        "max_completion_length": p.rollout.max_new_tokens,
        "temperature": p.rollout.temperature,
        "top_p": p.rollout.top_p,
        "top_k": p.rollout.top_k,
        "learning_rate": p.actor.lr,
        "lr_scheduler_type": "constant",
        "warmup_steps": 0,
        "weight_decay": p.actor.weight_decay,
        "max_grad_norm": p.actor.grad_clip,
        "beta": 0.0,
        "epsilon": p.actor.clip_ratio_low,
        "epsilon_high": p.actor.clip_ratio_high,
        "num_iterations": p.actor.ppo_epochs,
        "scale_rewards": "group" if p.algorithm.norm_adv_by_std else "none",
        "loss_type": "dapo",
        "max_steps": p.trainer.steps,
        "seed": p.run.seed,
        "use_cpu": True,
        "bf16": False,
        "report_to": [],
        "save_strategy": "no",
        "logging_steps": 10**9,
        "disable_tqdm": True,
        "log_completions": False,
        "dataloader_num_workers": 0,
    }


def run_trl(cfg: StepBenchConfig, out: Path, params: int, peak: float) -> dict[str, Any]:
    """TRL's GRPOTrainer on the same checkpoint, rows, template, reward and shape; evaluation runs
    in a callback off the clock, through rlctl's own validation path (HF rollout engine, greedy,
    the same scorer)."""
    import copy

    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rlctl.data import load_dataset
    from rlctl.dispatch import DataProto
    from rlctl.engines.hf_model import load_causal_lm
    from rlctl.engines.hf_rollout import HFRolloutEngine
    from rlctl.trainer.setup.evaluate import scorer_for
    from rlctl.trainer.setup.models import load_tokenizer, materialize_model, stop_token_ids
    from rlctl.trainer.setup.prompts import load_prompts

    profile = _profile(cfg, "sync", out)
    model_path = materialize_model(profile.model.path, out / "trl-base", seed=profile.run.seed)
    tokenizer = load_tokenizer(profile.model.tokenizer or model_path, profile.model.trust_remote_code)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    scorer = scorer_for(profile, tokenizer)
    _, val = load_prompts(profile, tokenizer)
    stops = stop_token_ids(model_path, tokenizer)
    rows = load_dataset(profile.data.train, "train", seed=profile.run.seed)
    data = Dataset.from_list(
        [
            {
                "prompt": r["prompt"],
                "ground_truth": r["reward_model"]["ground_truth"],
                "source": r["data_source"],
            }
            for r in rows
        ]
    )

    def exact_answer(prompts, completions, ground_truth, source, **_):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return list(scorer.manager.score(list(source), texts, list(ground_truth)).scores)

    def evaluate(model) -> float:
        engine = HFRolloutEngine(copy.deepcopy(model).cpu())
        out_ = engine.generate(
            val.batch["input_ids"],
            val.batch["attention_mask"],
            max_new_tokens=profile.rollout.max_new_tokens,
            greedy=True,
            eos_token_id=stops,
            pad_token_id=tokenizer.pad_token_id,
        )
        batch = DataProto.from_dict(tensors=out_, non_tensors=val.non_tensor)
        scored, _ = scorer.score(batch, shaping=False)
        return scored.batch["acc"].float().mean().item()

    clock = {"step_s": [], "curve": [], "tokens": []}

    class Clock(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kw):
            clock["curve"].append((0.0, evaluate(model)))

        def on_step_begin(self, args, state, control, **kw):
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, model=None, **kw):
            clock["step_s"].append(time.perf_counter() - self.start)
            s = state.global_step
            if s % profile.trainer.val_every == 0 or s == args.max_steps:
                clock["curve"].append((sum(clock["step_s"]), evaluate(model)))

    settings = trl_settings(profile)
    model = load_causal_lm(model_path, dtype="float32")
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=exact_answer,
        args=GRPOConfig(output_dir=str(out / "trl"), **settings),
        train_dataset=data,
        processing_class=tokenizer,
        callbacks=[Clock()],
    )
    with contextlib.redirect_stdout(sys.stderr):  # TRL prints its summary; stdout carries --json
        trainer.train()
    # tokens per step: prompts + completions, measured on the validation prompts' lengths (same task)
    mean_prompt = float(val.batch["attention_mask"].sum(-1).float().mean())
    tokens = profile.sequences_per_step * (mean_prompt + profile.rollout.max_new_tokens)
    row = summarise(
        "trl",
        clock["step_s"],
        clock["curve"],
        sequences=profile.sequences_per_step,
        tokens=[tokens],
        passes=1 + 3,
        params=params,
        peak_gflops=peak,
        target=cfg.target,
    )
    row["settings"] = {k: v for k, v in settings.items() if k not in ("report_to",)}
    return row


# -- the bench ---------------------------------------------------------------------------------------
def run_step_bench(cfg: StepBenchConfig) -> dict[str, Any]:
    """Every requested run, then the ratios and (with an out_dir) the PNG of the curves."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(cfg.out_dir or tmp)
        out.mkdir(parents=True, exist_ok=True)
        from rlctl.trainer.setup.models import materialize_model

        base = _profile(cfg, "sync", out)
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
