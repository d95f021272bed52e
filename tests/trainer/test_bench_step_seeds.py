"""``rlctl bench step`` over seeds, per-stage work and a baseline checkout: the arithmetic of the
report and the runs it starts, never their timings."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import pytest

from rlctl.bench.step import ratios
from rlctl.bench.step_baseline import baseline_args, seed_profile
from rlctl.bench.step_common import StepBenchConfig, shipped_profile
from rlctl.bench.step_flops import stage_work
from rlctl.bench.step_seeds import accuracy_at_equal_time, combine_seeds, equal_time
from tests.cli_runner import run_cli
from tests.trainer.test_bench_step import TINY

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]
# the bench step flags at 337d994 (the release before --seeds/--baseline), besides --against
FLAGS_AT_337D994 = {
    "--profile", "--steps", "--val-every", "--modes", "--prompts", "-n", "--lr", "--val-size",
    "--backend", "--max-staleness", "--out", "--json",
}  # fmt: skip


def _run(s_per_step, final, sustained, curve, stages, tokens=100.0):
    return {
        "steps": 5,
        "s_per_step": s_per_step,
        "samples_per_s": 8 / s_per_step,
        "train_s": 5 * s_per_step,
        "final_accuracy": final,
        "time_to_sustained_s": sustained,
        "step_gflop": 1.0,
        "matmul_fraction": 0.5,
        "tokens_per_step": tokens,
        "stages_s": stages,
        "curve": [{"train_s": t, "accuracy": a} for t, a in curve],
    }


def test_seeds_combine_into_medians_and_count_who_reached_the_target():
    runs = [
        _run(1.0, 0.9, 30.0, [(0, 0.1), (30, 0.9)], {"gen": 0.4, "update_actor": 0.5}),
        _run(3.0, 0.5, None, [(0, 0.1), (20, 0.5)], {"gen": 0.8, "update_actor": 0.9}),
        _run(2.0, 0.7, 50.0, [(0, 0.2), (50, 0.7)], {"gen": 0.6}),
    ]
    row = combine_seeds("sync", runs, [1, 2, 3])
    assert row["s_per_step"] == 2.0 and row["samples_per_s"] == 4.0  # each the median over the seeds
    assert row["time_to_sustained_s"] == 40.0 and row["reached"] == "2/3"  # over the seeds that reached it
    assert row["final_accuracy"] == 0.7 and row["curve_seed"] == 3 and row["curve"] == runs[2]["curve"]
    assert row["stages_s"] == {"gen": 0.6, "update_actor": 0.7}  # a stage a seed lacks is left out
    assert [s["seed"] for s in row["seeds"]] == [1, 2, 3] and row["seeds"][1]["s_per_step"] == 3.0
    assert equal_time([row]) == 20.0  # the shortest seed's last validation
    assert accuracy_at_equal_time(row, 20.0) == 0.2  # the median of the seeds at 20 s: 0.1, 0.5, 0.2
    none = combine_seeds("x", [runs[1]], [7])
    assert none["time_to_sustained_s"] is None and none["reached"] == "0/1"


def test_stage_work_counts_passes_epochs_and_the_critic():
    work = stage_work(
        {"gen": 2.0, "update_actor": 3.0, "values": 1.0, "reward": 0.1},
        50.0,
        params=1000,
        peak_gflops=1e-3,  # 1 MFLOP/s
        critic_params=400,
        actor_epochs=2,
    )
    assert work["gen"]["gflop"] == pytest.approx(2 * 1000 * 50 / 1e9)
    assert work["gen"]["floor_s"] == pytest.approx(0.1) and work["gen"]["fraction"] == pytest.approx(0.05)
    assert work["update_actor"]["gflop"] == pytest.approx(2 * 1000 * 50 * 3 * 2 / 1e9)
    assert work["values"]["gflop"] == pytest.approx(2 * 400 * 50 / 1e9)
    assert work["reward"] == {"seconds": 0.1, "gflop": None, "fraction": None, "floor_s": None}
    # rows skipped by the update (no gradient) are not counted as its work
    skipped = stage_work({"gen": 2.0, "update_actor": 3.0}, 50.0, params=1000, peak_gflops=1e-3, update_token_frac=0.25)
    assert skipped["update_actor"]["gflop"] == pytest.approx(2 * 1000 * 50 * 3 * 0.25 / 1e9)
    assert skipped["gen"]["gflop"] == pytest.approx(2 * 1000 * 50 / 1e9)


def test_ratios_compare_each_mode_with_the_baselines_same_mode():
    rows = [
        {"name": "sync", "samples_per_s": 10.0, "s_per_step": 1.0, "time_to_sustained_s": None},
        {"name": "async", "samples_per_s": 20.0, "s_per_step": 0.5, "time_to_sustained_s": None},
        {"name": "baseline-sync", "samples_per_s": 4.0, "s_per_step": 4.0, "time_to_sustained_s": None},
    ]
    assert ratios(rows) == {"async_samples_per_s_vs_sync": 2.0, "sync_s_per_step_vs_baseline": 0.25}


def test_baseline_gets_only_the_flags_its_release_knows(tmp_path):
    cfg = StepBenchConfig(
        steps=3, modes=("sync", "async"), seeds=2, against_trl=True, baseline="x", val_size=8
    )
    args = baseline_args(cfg, Path("/p.toml"), tmp_path)
    flags = {a for a in args if a.startswith("-") and not a.lstrip("-").replace(".", "").isdigit()}
    assert flags <= FLAGS_AT_337D994 and {"--val-size", "--json"} <= flags
    assert "--prompts" not in flags and args[args.index("--modes") + 1] == "sync,async"


def test_baseline_seed_profile_extends_the_original_with_the_seed(tmp_path):
    from rlctl.profile import load_profile

    cfg = StepBenchConfig()
    assert seed_profile(cfg, 0, 1, tmp_path) == shipped_profile().resolve()
    child = seed_profile(cfg, 2, 1, tmp_path)
    assert tomllib.loads(child.read_text())["run"] == {"seed": 3}
    original, seeded = load_profile(shipped_profile()), load_profile(child)
    assert seeded.run.seed == 3 and seeded.model.path == original.model.path  # resolved against the original


def test_baseline_without_rlctl_is_one_line_exit_2(tmp_path):
    code, out, err = run_cli("bench", "step", *TINY, "--baseline", str(tmp_path))
    assert code == 2 and out == ""
    assert err.strip().count("\n") == 0 and "--baseline" in err and str(tmp_path) in err


@pytest.mark.timeout(300)
def test_bench_step_runs_every_row_over_seeds(tmp_path):
    """Two seeds of sync: run.seed 1 and 2, the row their medians, stage work from its tokens."""
    code, out, err = run_cli(
        "bench", "step", *TINY, "--modes", "sync", "--seeds", "2", "--out", str(tmp_path), "--json"
    )
    assert code == 0, err
    result = json.loads(out)
    (row,) = result["rows"]
    assert result["seeds"] == [1, 2] and [s["seed"] for s in row["seeds"]] == [1, 2]
    for seed, run in ((1, "rlctl-sync"), (2, "rlctl-sync-seed2")):
        assert tomllib.loads((tmp_path / run / "profile.toml").read_text())["run"]["seed"] == seed
    assert row["s_per_step"] == pytest.approx(statistics.median(s["s_per_step"] for s in row["seeds"]))
    gen = row["stage_work"]["gen"]
    assert gen["gflop"] == pytest.approx(2 * result["matmul_params"] * row["tokens_per_step"] / 1e9)
    # the floor at the GEMM rate measured right before each run (the row's: their median)
    assert row["host_matmul_gflops"] == pytest.approx(
        statistics.median(s["host_matmul_gflops"] for s in row["seeds"])
    )
    assert gen["floor_s"] == pytest.approx(gen["gflop"] / row["host_matmul_gflops"])
    assert row["stage_work"]["reward"]["gflop"] is None and result["host_matmul_model_shape"]["gflops"] > 0
    update = row["stage_work"]["update_actor"]
    assert 0 < row["update_token_frac"] <= 1
    assert update["gflop"] == pytest.approx(gen["gflop"] * 3 * row["update_token_frac"])


@pytest.mark.timeout(300)
def test_bench_step_runs_a_baseline_checkout_side_by_side(tmp_path):
    """This checkout as its own baseline: a subprocess, its runs read back by this bench."""
    code, out, err = run_cli(
        "bench",
        "step",
        *TINY,
        "--modes",
        "sync",
        "--baseline",
        str(REPO),
        "--out",
        str(tmp_path / "b"),
        "--json",
    )
    assert code == 0, err
    result = json.loads(out)
    rows = {r["name"]: r for r in result["rows"]}
    assert set(rows) == {"sync", "baseline-sync"} and rows["baseline-sync"]["steps"] == 2
    sent = json.loads((tmp_path / "b" / "baseline" / "seed1.json").read_text())
    assert (
        sent["config"]["modes"] == ["sync"]
        and sent["config"]["steps"] == 2
        and sent["config"]["val_size"] == 8
    )
    assert result["ratios"]["sync_s_per_step_vs_baseline"] == pytest.approx(
        rows["sync"]["s_per_step"] / rows["baseline-sync"]["s_per_step"]
    )
    assert "update_actor" in rows["baseline-sync"]["stage_work"]
