"""``rlctl bench step`` on a tiny shape: the report's structure and arithmetic, never its timings."""

from __future__ import annotations

import json

import pytest

from rlctl.bench.step import ratios
from rlctl.bench.step_common import accuracy_at, summarise, sustained_time
from tests.cli_runner import run_cli

TINY = (
    "--steps",
    "2",
    "--val-every",
    "1",
    "--val-size",
    "8",
    "--prompts",
    "2",
    "-n",
    "2",
    "--backend",
    "inprocess",
)


def test_sustained_needs_three_validations_at_or_above_target_to_the_end():
    curve = [(0.0, 0.5), (10.0, 0.82), (20.0, 0.79), (30.0, 0.81), (40.0, 0.85), (50.0, 0.9)]
    assert sustained_time(curve, 0.8) == 30.0  # the dip at 20 s resets it
    assert sustained_time(curve[:5], 0.8) is None  # only two validations after the dip
    assert sustained_time([(0.0, 0.9), (1.0, 0.8), (2.0, 0.95)], 0.8) == 0.0
    assert accuracy_at(curve, 25.0) == 0.79 and accuracy_at(curve, -1.0) is None


def test_summary_counts_flops_and_medians_after_warmup():
    row = summarise(
        "x",
        [9.0, 9.0, 9.0, 1.0, 2.0, 3.0],
        [(0.0, 0.1)],
        sequences=10,
        tokens=[0, 0, 0, 100.0, 100.0, 100.0],
        passes=4,
        params=1000,
        peak_gflops=1.0,
        target=0.8,
        stages={"gen": [5.0, 5.0, 5.0, 0.5, 0.5, 0.5]},
    )
    assert row["s_per_step"] == 2.0 and row["samples_per_s"] == 5.0
    assert row["step_gflop"] == pytest.approx(2 * 1000 * 100 * 4 / 1e9)
    assert row["matmul_fraction"] == pytest.approx(row["step_gflop"] / 2.0)
    assert row["stages_s"] == {"gen": 0.5}
    r = ratios([row | {"name": "sync"}, row | {"name": "async", "samples_per_s": 10.0}])
    assert r == {"async_samples_per_s_vs_sync": 2.0}


@pytest.mark.timeout(300)
def test_bench_step_json_runs_each_mode(tmp_path):
    code, out, err = run_cli(
        "bench", "step", *TINY, "--modes", "sync,async", "--out", str(tmp_path), "--json"
    )
    assert code == 0, err
    result = json.loads(out)
    assert [r["name"] for r in result["rows"]] == ["sync", "async"]
    for r in result["rows"]:
        assert r["steps"] == 2 and r["s_per_step"] > 0 and r["samples_per_s"] > 0
        assert [p["train_s"] for p in r["curve"]][0] == 0.0 and len(r["curve"]) == 3
        assert r["matmul_fraction"] > 0 and "update_actor" in r["stages_s"]
    assert "wait_rollout" in result["rows"][1]["stages_s"] and "staleness_mean" in result["rows"][1]
    assert "async_samples_per_s_vs_sync" in result["ratios"]
    # the bare model at the sync run's shapes: 2 prompts x 2, its response length, both thread splits
    bare, sync = result["bare_model"], result["rows"][0]
    assert (bare["prompts"], bare["n"]) == (2, 2) and bare["response_tokens"] > 0
    assert bare["update_prompts"] == max(1, round(2 * sync["update_token_frac"]))
    assert sync["response_tokens"] == pytest.approx(bare["response_tokens"], abs=0.25 + 1e-9)
    assert bare["step_s"] > 0 and bare["overlapped_step_s"] > 0
    assert set(result["ratios"]) >= {"sync_s_per_step_vs_bare_model", "async_s_per_step_vs_bare_model"}
    # accuracy at the training seconds both runs reached: the shorter run's last validation
    equal = min(r["curve"][-1]["train_s"] for r in result["rows"])
    assert result["equal_time_s"] == equal
    for r in result["rows"]:
        seen = [p["accuracy"] for p in r["curve"] if p["train_s"] <= equal + 1e-9]
        assert r["accuracy_at_equal_time"] == seen[-1]
    assert result["shape"]["prompts_per_step"] == 2 and result["host_matmul_gflops"] > 0
    assert (tmp_path / "bench_step.png").is_file()


def test_bench_step_refuses_unknown_modes():
    code, _, err = run_cli("bench", "step", "--modes", "sync,fast")
    assert code != 0 and "--modes" in err


@pytest.mark.timeout(300)
def test_bench_step_against_trl_runs_trl_on_the_same_shape(tmp_path):
    pytest.importorskip("trl", reason="--against trl needs the bench extra (trl==1.16.0)")
    code, out, err = run_cli(
        "bench", "step", *TINY, "--modes", "sync", "--against", "trl", "--seeds", "2", "--json"
    )
    assert code == 0, err
    result = json.loads(out)
    rows = {r["name"]: r for r in result["rows"]}
    assert set(rows) == {"sync", "trl"}
    trl = rows["trl"]
    assert trl["steps"] == 2 and len(trl["curve"]) == 3
    assert trl["settings"]["per_device_train_batch_size"] == 4 and trl["settings"]["num_generations"] == 2
    assert trl["settings"]["learning_rate"] == 2e-4 and trl["settings"]["max_completion_length"] == 4
    assert trl["settings"]["gradient_checkpointing"] is False  # the profile's actor; TRL's default is True
    assert [s["settings"]["seed"] for s in trl["seeds"]] == [1, 2]  # GRPOConfig's seed follows run.seed
    # the step split at TRL's generate-and-score method: generation + update = the step, per step
    for seed in trl["seeds"]:
        assert set(seed["stages_s"]) == {"gen", "update_actor"} and seed["tokens_per_step"] > 4 * 4
    work = trl["stage_work"]
    assert work["update_actor"]["gflop"] == pytest.approx(3 * work["gen"]["gflop"])
    assert work["gen"]["gflop"] == pytest.approx(2 * result["matmul_params"] * trl["tokens_per_step"] / 1e9)


def test_bench_step_rows_switch_partial_rollouts_and_delta_pushes_on_async(tmp_path):
    """The long-tail rows beyond the modes: async with in-flight swaps, with carried partial
    rollouts, with delta pushes; each compared with sync and with today's async."""
    from rlctl.bench.step_common import StepBenchConfig, bench_profile

    cfg = StepBenchConfig(profile="profiles/tiny-cpu-longtail.toml", steps=2, backend="inprocess")
    swap = bench_profile(cfg, "async-swap", tmp_path)
    carry = bench_profile(cfg, "async-carry", tmp_path)
    delta = bench_profile(cfg, "async-delta", tmp_path)
    plain = bench_profile(cfg, "async", tmp_path)
    assert (swap.trainer.mode, swap.trainer.partial_rollouts, swap.rollout.delta_sync) == ("async", "swap", False)
    assert (carry.trainer.mode, carry.trainer.partial_rollouts, carry.rollout.delta_sync) == ("async", "carry", False)
    assert (delta.trainer.mode, delta.trainer.partial_rollouts, delta.rollout.delta_sync) == ("async", "off", True)
    assert (plain.trainer.partial_rollouts, plain.rollout.delta_sync) == ("off", False)
    assert carry.run.name == "rlctl-async-carry"
    rows = [{"name": n, "samples_per_s": s, "time_to_sustained_s": None} for n, s in
            (("sync", 10.0), ("async", 12.0), ("async-carry", 18.0))]
    out = ratios(rows)
    assert out["async-carry_samples_per_s_vs_sync"] == 1.8 and out["async-carry_samples_per_s_vs_async"] == 1.5
    assert "async_samples_per_s_vs_async" not in out
