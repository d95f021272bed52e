"""A synthetic run directory shaped like the driver's metrics.jsonl (GRPO: no critic keys)."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest

STAGES = {"gen": 0.05, "old_log_prob": 0.01, "ref": 0.008, "reward": 0.002, "adv": 0.0005,
          "update_actor": 0.02, "sync": 0.003}  # fmt: skip


def write_run(run_dir: Path, steps: int = 120, val_every: int = 10, seed: int = 0) -> list[dict]:
    """Write metrics.jsonl: an initial validation at step 0, training steps 1..steps, validation
    every ``val_every`` steps in a separate line (as a driver may log it), accuracy rising 0.35 -> 0.9."""
    rng = random.Random(seed)
    run_dir.mkdir(parents=True, exist_ok=True)
    lines: list[dict] = [{"step": 0, "val/accuracy": 0.35}]
    clock = 0.0
    for step in range(1, steps + 1):
        progress = 1 - math.exp(-step / (steps / 4))
        times = {f"time/{k}": v * rng.uniform(0.8, 1.2) for k, v in STAGES.items()}
        step_time = sum(times.values())
        clock += step_time
        acc = min(1.0, 0.35 + 0.55 * progress + rng.gauss(0, 0.05))
        rec = {
            "step": step,
            "train_time_s": clock,
            "reward/score_mean": acc,
            "reward/score_std": 0.4,
            "reward/accuracy": acc,
            "reward/errors": 0,
            "response_length/mean": 4 + rng.random(),
            "response_length/max": 8,
            "response_length/clip_ratio": max(0.0, 0.2 - 0.2 * progress),
            "actor/kl_loss": 0.01 * progress + rng.random() * 1e-3,
            "actor/entropy": 1.5 - progress + rng.random() * 0.05,
            "actor/pg_clipfrac": 0.01,
            "actor/grad_norm": 1.0 + rng.random(),
            "actor/lr": 3e-5,
            "actor/pg_loss": rng.gauss(0, 0.1),
            **times,
            "time/step": step_time,
            "perf/tokens_per_s": 1000.0 + rng.random() * 100,
        }
        lines.append(rec)
        if step % val_every == 0:
            lines.append({"step": step, "val/accuracy": round(min(1.0, 0.35 + 0.6 * progress), 4)})
    with open(run_dir / "metrics.jsonl", "w") as fh:
        for rec in lines:
            fh.write(json.dumps(rec) + "\n")
    return lines


@pytest.fixture
def synthetic_run(tmp_path: Path) -> Path:
    run_dir = tmp_path / "run"
    write_run(run_dir)
    return run_dir
