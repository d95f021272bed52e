"""The weight-sync check is always on: a sync that leaves one tensor out stops the run at that
step naming the tensor; healthy runs log ``sync/fingerprint_ok = 1`` and the weight version each
rollout sampled with; the rollout-vs-trainer log-prob gap alarm fails past its threshold."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from rlctl.engines.hf_rollout import HFRolloutEngine
from rlctl.errors import RunError
from rlctl.trainer.state.fingerprint import SKIP_ENV, LogProbGapAlarm, merge_sync_metrics
from tests.cli_runner import run_cli
from tests.trainer.test_train_e2e import by_step, metrics

SKIPPED = "model.layers.0.self_attn.q_proj.weight"


def _error_line(err: str) -> str:
    """The CLI's one-line failure (Ray may forward worker log lines after it)."""
    return next(line for line in err.splitlines() if line.startswith("rlctl: error:"))


@pytest.mark.timeout(300)
def test_sync_that_skips_a_tensor_stops_within_the_step_naming_it(write_profile, tmp_path, monkeypatch):
    profile = write_profile("skip", steps=2, entropy_coeff=0.01)
    monkeypatch.setenv(SKIP_ENV, f"{SKIPPED}@2")
    code, _, err = run_cli("train", str(profile), "--set", "trainer.save_every=0")
    assert code == 1, err
    last = err.strip().splitlines()[-1]
    for needle in ("step=2", "method=sync_weights", "rank=0", repr(SKIPPED), "differs from the trainer"):
        assert needle in last, (needle, last)
    steps = by_step(metrics(tmp_path / "runs/skip"))
    assert max(steps) == 1, "no step after the broken sync may be logged"
    assert steps[1]["sync/fingerprint_ok"] == 1.0


class DroppingRollout(HFRolloutEngine):
    """A test double of a loader that silently leaves one tensor out from its third load on."""

    loads = 0

    def update_weights(self, stream):
        self.loads += 1
        if self.loads > 2:
            stream = [(name, t) for name, t in stream if name != SKIPPED]
        return super().update_weights(stream)


@pytest.mark.timeout(300)
def test_a_push_to_the_rollout_workers_that_skips_a_tensor_stops_naming_it(
    write_profile, tmp_path, rollout_engine_class
):
    """one_step_off: each push is fingerprinted on the rollout worker, canary due or not (the HF
    engine's canary is a spot check: weight version 3 gets none)."""
    rollout_engine_class(DroppingRollout)
    profile = write_profile("push-skip", steps=4, extra='mode = "one_step_off"\n', entropy_coeff=0.01)
    code, _, err = run_cli(
        "train", str(profile), "--set", "trainer.save_every=0", "--set", "trainer.val_every=0"
    )
    assert code == 1, err
    last = _error_line(err)
    for needle in (
        "role=rollout",
        "method=update_weights",
        "weight version (rollout worker, DroppingRollout) 3",
        repr(SKIPPED),
        "differs from the trainer",
    ):
        assert needle in last, (needle, last)
    steps = by_step(metrics(tmp_path / "runs/push-skip"))
    assert steps and all(steps[s]["sync/fingerprint_ok"] == 1.0 for s in steps if s > 0)


@pytest.mark.timeout(600)
def test_two_ranks_on_ray_check_the_reshard_and_stop_on_a_skipped_tensor(
    write_profile, tmp_path, monkeypatch, ray_session
):
    """Two FSDP2 ranks: each fingerprints its own shards (sums all-reduced) against its rollout copy."""
    profile = write_profile("ray-skip", backend="ray", steps=2, entropy_coeff=0.01)
    profile.write_text(profile.read_text().replace("[cluster]", "[cluster]\ndevices_per_node = 2"))
    monkeypatch.setenv(SKIP_ENV, f"{SKIPPED}@2")  # read on the driver, passed to every rank
    code, _, err = run_cli("train", str(profile), "--set", "trainer.save_every=0")
    assert code == 1, err
    last = _error_line(err)
    for needle in ("step=2", "method=sync_weights", repr(SKIPPED)):
        assert needle in last, (needle, last)
    steps = by_step(metrics(tmp_path / "runs/ray-skip"))
    assert max(steps) == 1 and steps[1]["sync/fingerprint_ok"] == 1.0


@pytest.mark.timeout(300)
def test_healthy_run_logs_fingerprint_ok_and_weight_versions(write_profile, tmp_path):
    profile = write_profile("ok", steps=2)
    code, _, err = run_cli("train", str(profile), "--set", "trainer.save_every=0")
    assert code == 0, err
    steps = by_step(metrics(tmp_path / "runs/ok"))
    for step in (1, 2):
        assert steps[step]["sync/fingerprint_ok"] == 1.0
        assert steps[step]["sync/fingerprint_s"] >= 0
        # the start-up sync is version 1; step s samples with the weights of s - 1 updates
        assert steps[step]["rollout/weight_version"] == float(step)


@pytest.mark.timeout(300)
def test_log_prob_gap_past_the_profile_threshold_fails_the_step(write_profile, tmp_path):
    profile = write_profile("gap", steps=2)
    # ppo_epochs = 2 forces the old-log-prob recompute, so the gap is measured; on fp32 CPU it is
    # ~1e-7 nats, far above this threshold
    code, _, err = run_cli(
        "train",
        str(profile),
        "--set",
        "trainer.save_every=0",
        "--set",
        "actor.ppo_epochs=2",
        "--set",
        "trainer.max_log_prob_gap=1e-12",
        "--set",
        "trainer.val_at_start=false",
    )
    assert code == 1, err
    last = err.strip().splitlines()[-1]
    assert "step 1" in last and "trainer.max_log_prob_gap" in last, last


def test_gap_alarm_warns_on_a_jump_then_errors_past_the_limit():
    alarm = LogProbGapAlarm(limit=1.0)
    with capture_logs() as logs:
        for step, gap in enumerate([0.01, 0.012, 0.011], start=1):
            alarm.check({"rollout/log_prob_diff_mean": gap}, step)
        assert logs == []
        alarm.check({"rollout/log_prob_diff_mean": 0.3}, 4)
    assert [(r["log_level"], r["step"]) for r in logs] == [("warning", 4)]
    assert "jumped" in logs[0]["event"]
    with pytest.raises(RunError, match="max_log_prob_gap"):
        alarm.check({"rollout/log_prob_diff_mean": 1.5, "rollout/log_prob_diff_max": 9.0}, 5)
    LogProbGapAlarm(limit=0).check({"rollout/log_prob_diff_mean": 50.0}, 1)  # 0 = off
    LogProbGapAlarm(limit=1.0).check({}, 1)  # no gap measured this step: nothing to watch


def test_ranks_merge_to_the_worst_verdict():
    ok = {"sync/fingerprint_ok": 1.0, "sync/fingerprint_s": 0.1, "sync/weight_version": 3.0}
    unknown = {**ok, "sync/fingerprint_ok": -1.0, "sync/fingerprint_s": 0.2}
    merged = merge_sync_metrics([ok, unknown])
    assert merged["sync/fingerprint_ok"] == -1.0 and merged["sync/fingerprint_s"] == 0.2
    assert merged["rollout/weight_version"] == 2.0
