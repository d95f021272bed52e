"""One row of ``rlctl bench step`` out of its runs over ``--seeds k`` seeds.

Every number of the row is the median over the seeds of that seed's value (s/step, samples/s,
final accuracy, per-stage seconds, tokens per step); time to sustained target is the median over
the seeds that reached it, with ``reached`` saying how many did ("2/3"). Each seed's own values
are under ``seeds``. The row's ``curve`` is one seed's: the one with the median final accuracy
(the lower median for an even k), named by ``curve_seed``; the PNG draws every seed's curve.
"""

from __future__ import annotations

import statistics
from typing import Any

from rlctl.bench.step_common import accuracy_at

PER_SEED_KEYS = (
    "steps",
    "s_per_step",
    "samples_per_s",
    "train_s",
    "final_accuracy",
    "time_to_sustained_s",
    "step_gflop",
    "matmul_fraction",
    "tokens_per_step",
    "update_token_frac",
    "response_tokens",
    "stages_s",
    "curve",
    "staleness_mean",
    "staleness_max",
    "settings",
    "host_matmul_gflops",
)


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def combine_seeds(name: str, runs: list[dict[str, Any]], seeds: list[int]) -> dict[str, Any]:
    """The row of ``name`` from its per-seed :func:`~rlctl.bench.step_common.summarise` rows."""
    per_seed = [
        {"seed": s, **{k: r[k] for k in PER_SEED_KEYS if k in r}} for s, r in zip(seeds, runs, strict=True)
    ]
    reached = [r["time_to_sustained_s"] for r in runs if r["time_to_sustained_s"] is not None]
    by_acc = sorted(
        range(len(runs)), key=lambda i: (runs[i]["final_accuracy"] is None, runs[i]["final_accuracy"] or 0)
    )
    mid = by_acc[(len(by_acc) - 1) // 2]
    stage_names = sorted({k for r in runs for k in r["stages_s"]})
    row: dict[str, Any] = {
        "name": name,
        "seeds": per_seed,
        "steps": runs[0]["steps"],
        "s_per_step": statistics.median(r["s_per_step"] for r in runs),
        "samples_per_s": statistics.median(r["samples_per_s"] for r in runs),
        "train_s": statistics.median(r["train_s"] for r in runs),
        "final_accuracy": _median([r["final_accuracy"] for r in runs]),
        "time_to_sustained_s": statistics.median(reached) if reached else None,
        "reached": f"{len(reached)}/{len(runs)}",
        "curve": runs[mid]["curve"],
        "curve_seed": seeds[mid],
        "step_gflop": _median([r["step_gflop"] for r in runs]),
        "matmul_fraction": _median([r["matmul_fraction"] for r in runs]),
        "tokens_per_step": _median([r.get("tokens_per_step") for r in runs]),
        "update_token_frac": _median([r.get("update_token_frac", 1.0) for r in runs]),
        "response_tokens": _median([r.get("response_tokens") for r in runs]),
        "host_matmul_gflops": _median([r.get("host_matmul_gflops") for r in runs]),
        "stages_s": {k: _median([r["stages_s"].get(k) for r in runs]) for k in stage_names},
    }
    if "settings" in runs[0]:  # TRL's GRPOConfig settings; each seed's (its seed) under seeds
        row["settings"] = runs[0]["settings"]
    if any("staleness_mean" in r for r in runs):
        row["staleness_mean"] = _median([r.get("staleness_mean") for r in runs])
        row["staleness_max"] = max(r.get("staleness_max", 0.0) for r in runs)
    return row


def equal_time(rows: list[dict[str, Any]]) -> float:
    """The training seconds every run of every row reached: the shortest run's last validation."""
    ends = [s["curve"][-1]["train_s"] for r in rows for s in r["seeds"] if s["curve"]]
    return min(ends) if ends else 0.0


def accuracy_at_equal_time(row: dict[str, Any], seconds: float) -> float | None:
    """The median over seeds of each seed's latest validated accuracy at ``seconds``."""
    return _median(
        [accuracy_at([(p["train_s"], p["accuracy"]) for p in s["curve"]], seconds) for s in row["seeds"]]
    )
