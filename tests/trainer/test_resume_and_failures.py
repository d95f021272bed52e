"""A killed run resumes on the same trajectory; a failing rank stops the run with a clear message."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.trainer.test_train_e2e import by_step, metrics

RLCTL = [sys.executable, "-m", "rlctl.cli.main"]


def rlctl(*args: str, env: dict | None = None, **kw) -> subprocess.Popen:
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}
    return subprocess.Popen(
        [*RLCTL, *args], env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw
    )


def kill_at_checkpoint(profile: Path, checkpoint: Path) -> None:
    """Train ``profile`` and SIGKILL it as soon as ``checkpoint`` holds its driver state."""
    proc = rlctl("train", str(profile))
    saved = checkpoint / "driver.pt"
    deadline = time.monotonic() + 400
    while not saved.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert saved.exists(), proc.stderr.read() if proc.poll() is not None else "no checkpoint in time"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)


def trained_by_step(run_dir: Path, key: str) -> dict[int, list]:
    """Per step, ``key`` of every training row in ``samples.jsonl`` that the last process to train
    that step wrote (a killed run's rows of a step trained again after the resume are dropped), sorted."""
    rows = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    out: dict[int, tuple[int, list]] = {}
    for r in (r for r in rows if r["phase"] == "train"):
        start, values = out.get(r["step"], (-1, []))
        if r["start_step"] > start:
            start, values = r["start_step"], []
        if r["start_step"] == start:
            values.append(r[key])
        out[r["step"]] = (start, values)
    return {step: sorted(values) for step, (_, values) in out.items()}


@pytest.mark.timeout(600)
# one_step_off's pipeline resumes as the async one does (its kill-and-resume tests run by default,
# with swaps and with carried rollouts), and its own resume on stale samples is tested below: slow here
@pytest.mark.parametrize("mode", ["sync", pytest.param("one_step_off", marks=pytest.mark.slow)])
def test_killed_run_resumes_with_identical_metrics(write_profile, tmp_path, mode):
    mode_line = f'mode = "{mode}"\n'  # TINY_RL ends in [trainer]
    full = write_profile("full", steps=6, extra=mode_line)
    broken = write_profile("broken", steps=6, extra=mode_line)
    proc = rlctl("train", str(full))
    _, err = proc.communicate(timeout=500)
    assert proc.returncode == 0, err

    kill_at_checkpoint(broken, tmp_path / "runs/broken/checkpoints/step_000002")
    killed_at = max(r["step"] for r in metrics(tmp_path / "runs/broken"))
    assert killed_at < 6

    proc = rlctl("train", str(broken), "--resume", "auto")
    _, err = proc.communicate(timeout=500)
    assert proc.returncode == 0, err
    resumed = by_step(metrics(tmp_path / "runs/broken"))
    assert sorted(resumed) == list(range(7)), "metrics.jsonl must hold each step exactly once"
    full_steps = by_step(metrics(tmp_path / "runs/full"))
    assert_same_logged_values(resumed, full_steps, range(7))
    assert all(full_steps[step]["rollout/weight_version"] == step - (mode != "sync") for step in range(2, 7))


def is_timing(key: str) -> bool:
    """Wall-clock keys (seconds, rates) and the processes' peak memory: the only values a resumed
    run may log differently (a process's peak resident set varies run to run by allocator timing)."""
    return key.startswith(("time/", "perf/", "memory/")) or key.endswith("_s")


def assert_same_logged_values(a: dict[int, dict], b: dict[int, dict], steps) -> None:
    """Every logged non-timing key of every step present in both runs, with equal values."""
    for step in steps:
        keys_a = {k for k in a[step] if not is_timing(k)}
        keys_b = {k for k in b[step] if not is_timing(k)}
        assert keys_a == keys_b, (step, keys_a ^ keys_b)
        for key in sorted(keys_a):
            assert a[step][key] == pytest.approx(b[step][key], rel=1e-5, abs=1e-6), (step, key)


@pytest.mark.timeout(300)
def test_failing_rank_names_role_rank_step_and_keeps_checkpoint(write_profile, tmp_path):
    profile = write_profile("fails", steps=4)
    profile.write_text(profile.read_text().replace("save_every = 2", "save_every = 1"))
    start = time.monotonic()
    proc = rlctl("train", str(profile), env={"RLCTL_INJECT_FAULT": "update_actor@2"})
    _, err = proc.communicate(timeout=280)
    assert proc.returncode == 1, err
    assert time.monotonic() - start < 280
    last = err.strip().splitlines()[-1]
    assert last.startswith("rlctl: error:"), last
    for needle in ("step=2", "role=policy", "rank=0", "method=update_actor", "injected fault"):
        assert needle in last, (needle, last)
    assert "Traceback" not in err
    assert "remote traceback" in (tmp_path / "runs/fails/error.log").read_text()
    ckpt = tmp_path / "runs/fails/checkpoints"
    assert [p.name for p in ckpt.iterdir() if not p.name.startswith(".")] == ["step_000001"]
    import torch

    state = torch.load(ckpt / "step_000001/driver.pt", weights_only=False)
    assert state["step"] == 1
    steps = [json.loads(x)["step"] for x in (tmp_path / "runs/fails/metrics.jsonl").read_text().splitlines()]
    assert max(steps) == 1


@pytest.mark.timeout(400)
@pytest.mark.parametrize(
    ("signum", "code"),
    # SIGINT and SIGUSR1 take the handler SIGTERM takes (only the exit code differs; each one's
    # handling is tested in process in test_stop_signals.py): slow, beside it
    [
        pytest.param(signal.SIGINT, 130, marks=pytest.mark.slow),
        (signal.SIGTERM, 143),
        pytest.param(signal.SIGUSR1, 138, marks=pytest.mark.slow),
    ],
    ids=["int", "term", "usr1"],
)
def test_a_stop_signal_finishes_the_step_saves_and_resumes_exactly(write_profile, tmp_path, signum, code):
    """Ctrl-C, a scheduler's SIGTERM and SLURM's SIGUSR1 before preemption all lose nothing."""
    profile = write_profile("stopped", steps=40)
    profile.write_text(profile.read_text().replace("save_every = 2", "save_every = 0"))
    proc = rlctl("train", str(profile))
    log = tmp_path / "runs/stopped/metrics.jsonl"
    deadline = time.monotonic() + 200
    while time.monotonic() < deadline and proc.poll() is None:
        if log.exists() and any(
            json.loads(x)["step"] >= 2 for x in log.read_text().splitlines() if x.strip()
        ):
            break
        time.sleep(0.05)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err
    assert "Traceback" not in err
    saved = sorted((tmp_path / "runs/stopped/checkpoints").glob("step_*"))
    assert len(saved) == 1, "save_every = 0: only the stop's save exists"
    stopped_at = int(saved[0].name.split("_")[1])
    assert 2 <= stopped_at < 40
    assert max(r["step"] for r in metrics(tmp_path / "runs/stopped")) == stopped_at
    name = signal.Signals(signum).name
    assert (
        err.strip().splitlines()[-1]
        == f"rlctl: stopped by {name} after saving the checkpoint of step {stopped_at}"
    )

    proc = rlctl("train", str(profile), "--max-steps", str(stopped_at + 2))
    _, err = proc.communicate(timeout=200)
    assert proc.returncode == 0, err
    resumed = by_step(metrics(tmp_path / "runs/stopped"))
    assert sorted(resumed) == list(range(stopped_at + 3))
    if signum == signal.SIGTERM:  # continued exactly: the same values as a run never stopped
        full = write_profile("never-stopped", steps=40)
        full.write_text(full.read_text().replace("save_every = 2", "save_every = 0"))
        proc = rlctl("train", str(full), "--max-steps", str(stopped_at + 2))
        _, err = proc.communicate(timeout=200)
        assert proc.returncode == 0, err
        assert_same_logged_values(
            resumed, by_step(metrics(tmp_path / "runs/never-stopped")), range(stopped_at + 3)
        )


@pytest.mark.timeout(600)
def test_one_step_off_stopped_by_max_steps_resumes_on_one_step_stale_samples(write_profile, tmp_path):
    """A run stopped with --max-steps keeps the batch generated one update stale in its last
    checkpoint, so the resumed run trains what the uninterrupted run trains (it used to train its
    first resumed step on fresh samples)."""
    mode_line = 'mode = "one_step_off"\n'
    full = write_profile("full", steps=4, extra=mode_line)
    split = write_profile("split", steps=4, extra=mode_line)
    for profile, extra in ((full, ()), (split, ("--max-steps", "2")), (split, ("--resume", "auto"))):
        proc = rlctl("train", str(profile), *extra)
        _, err = proc.communicate(timeout=500)
        assert proc.returncode == 0, err
    assert (tmp_path / "runs/split/checkpoints/step_000002/pending").is_dir()
    resumed, full_steps = by_step(metrics(tmp_path / "runs/split")), by_step(metrics(tmp_path / "runs/full"))
    assert sorted(resumed) == list(range(5))
    assert resumed[3]["rollout/weight_version"] == 2  # one update stale, as in the full run
    assert_same_logged_values(resumed, full_steps, range(5))
