"""A stop signal to the whole process group (SLURM's scancel, ``timeout``, ``kill -- -PGID``).

Before: the driver saved, then waited 60 s for the Ray GCS that died with the same signal and
exited 1; after a SIGKILL of the driver, Ray's agents outlived it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.trainer.test_train_e2e import metrics

RLCTL = [sys.executable, "-m", "rlctl.cli.main"]
GRACE_S = 30.0  # SLURM's default KillWait: SIGKILL follows SIGTERM after 30 s


def _start(profile: Path) -> subprocess.Popen:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.Popen(
        [*RLCTL, "train", str(profile)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True,  # its own group, as a batch step's
    )  # fmt: skip


def _wait_for_step(proc: subprocess.Popen, log: Path, step: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        if log.exists() and any(
            json.loads(x)["step"] >= step for x in log.read_text().splitlines() if x.strip()
        ):
            return
        time.sleep(0.05)
    out, err = proc.communicate(timeout=60) if proc.poll() is not None else ("", "")
    pytest.fail(f"no step {step} in time: {err[-3000:]}")


@pytest.mark.timeout(600)
# Ray is where a group signal hung the stop; the in-process run is the same driver path without it
@pytest.mark.parametrize("backend", [pytest.param("inprocess", marks=pytest.mark.slow), "ray"])
def test_sigterm_to_the_group_saves_exits_143_in_the_grace_and_resumes(write_profile, tmp_path, backend):
    profile = write_profile("grp", backend=backend, steps=40)
    profile.write_text(profile.read_text().replace("save_every = 2", "save_every = 0"))
    proc = _start(profile)
    _wait_for_step(proc, tmp_path / "runs/grp/metrics.jsonl", 2, 400)
    sent = time.monotonic()
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=GRACE_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
        pytest.fail(f"still running {GRACE_S:.0f} s after SIGTERM to the group: {err[-3000:]}")
    took = time.monotonic() - sent
    assert proc.returncode == 143, err[-3000:]
    saved = sorted((tmp_path / "runs/grp/checkpoints").glob("step_*"))
    assert len(saved) == 1, "save_every = 0: only the stop's save exists"
    stopped_at = int(saved[0].name.split("_")[1])
    assert max(r["step"] for r in metrics(tmp_path / "runs/grp")) == stopped_at
    print(f"{backend}: exit 143 {took:.1f} s after SIGTERM to the group, checkpoint of step {stopped_at}")
    # the stop's checkpoint resumes on the in-process backend (a Ray start is not what this tests)
    resumed = profile.read_text().replace("steps = 40", f"steps = {stopped_at + 1}")
    profile.write_text(resumed.replace('backend = "ray"', 'backend = "inprocess"'))
    again = subprocess.run(
        [*RLCTL, "train", str(profile), "--resume", "auto"], env={**os.environ, "HF_HUB_OFFLINE": "1"},
        capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"step {stopped_at}" in again.stderr or "resum" in again.stderr.lower()
    assert max(r["step"] for r in metrics(tmp_path / "runs/grp")) == stopped_at + 1


def test_stopping_the_workers_is_bounded_after_a_stop():
    """A worker runtime that cannot answer (gone with the signal) does not hold the exit."""
    from rlctl.trainer.run import shutdown_within

    start = time.monotonic()
    assert shutdown_within(lambda: time.sleep(30), 0.5) is False
    assert time.monotonic() - start < 5
    assert shutdown_within(lambda: None, 5) is True

    def fails() -> None:
        raise ConnectionError("Failed to connect to GCS within 60 seconds")

    assert shutdown_within(fails, 5) is False


def _tree(root: int) -> list[int]:
    from rlctl.dispatch.ray_network import process_tree

    return [p for p in process_tree(root) if p != root]


def _alive(pids: list[int]) -> list[str]:
    out = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                zombie = f.read().rsplit(")", 1)[1].split()[0] == "Z"
            if not zombie:
                out.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:80])
        except OSError:
            continue
    return out


@pytest.mark.timeout(600)
def test_nothing_of_the_ray_cluster_outlives_a_sigkilled_driver(write_profile, tmp_path):
    profile = write_profile("killed", backend="ray", steps=40)
    proc = _start(profile)
    _wait_for_step(proc, tmp_path / "runs/killed/metrics.jsonl", 1, 400)
    started = _tree(proc.pid)
    assert any("raylet" in c for c in _alive(started)), "the run's Ray processes were not found"
    # the cluster lives in a private 0700 temp dir, not the shared /tmp/ray (mode 777 sessions)
    raylet = next(
        p for p in started if "raylet" in Path(f"/proc/{p}/cmdline").read_bytes().decode(errors="replace")
    )
    text = Path(f"/proc/{raylet}/cmdline").read_bytes().decode(errors="replace")
    temp = set(re.findall(r"(/tmp/rlctl-ray-[^/\s=\0]+)/r/session_", text))
    assert len(temp) == 1 and "/tmp/ray/" not in text, text
    assert os.stat(temp.pop()).st_mode & 0o777 == 0o700
    proc.send_signal(signal.SIGKILL)  # the driver only: its Ray processes are left to themselves
    proc.communicate(timeout=60)
    deadline = time.monotonic() + 20
    while _alive(started) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _alive(started) == [], "outlived the driver"
