"""Custom rewards run in scorer processes: a timeout kills the sample's process (and what it started)."""

from __future__ import annotations

import os
import textwrap
import threading

import pytest

from rlctl.rewards import build_reward_manager

SCORER = textwrap.dedent(
    """
    import os, subprocess, sys

    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        if solution_str == "spin":
            while True:  # burns a CPU until killed
                pass
        if solution_str == "child":  # starts a process of its own, then hangs
            proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
            with open(extra_info["pidfile"], "w") as f:
                f.write(str(proc.pid))
            while True:
                pass
        if solution_str == "die":
            os._exit(3)
        return float(solution_str == ground_truth)
    """
)


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie (Linux /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture
def manager(tmp_path):
    path = tmp_path / "scorer.py"
    path.write_text(SCORER)
    mgr = build_reward_manager(
        "custom", function=f"{path}:compute_score", timeout_s=0.5, num_workers=2, max_error_rate=1.0
    )
    yield mgr
    mgr.close()


@pytest.mark.timeout(120)
def test_timeouts_kill_the_process_and_nothing_keeps_running(manager, tmp_path):
    threads_before = threading.active_count()
    pidfile = tmp_path / "child.pid"
    infos = [{}, {}, {"pidfile": str(pidfile)}, {}, {}]
    for _ in range(3):  # every batch has timeouts; the pool must not grow
        out = manager.score(["s"] * 5, ["a", "spin", "child", "spin", "b"], ["a", "a", "a", "a", "b"], infos)
        assert out.scores == [1.0, 0.0, 0.0, 0.0, 1.0]
        assert out.metrics["reward/timeouts"] == 3.0 and out.metrics["reward/errors"] == 0.0
        live = manager.pool.live_pids()
        assert len(live) <= 2
        assert [p for p in manager.pool.started_pids if p not in live and alive(p)] == []
        assert not alive(int(pidfile.read_text()))  # the scorer's own child died with its group
    assert threading.active_count() == threads_before  # no abandoned scorer threads
    assert not [t.name for t in threading.enumerate() if t.name.startswith("rlctl-reward")]


@pytest.mark.timeout(60)
def test_a_dying_scorer_process_is_an_error_and_is_replaced(manager):
    out = manager.score(["s"] * 3, ["die", "a", "a"], ["a"] * 3)
    assert out.scores == [0.0, 1.0, 1.0] and out.metrics["reward/errors"] == 1.0
    assert manager.score(["s"], ["a"], ["a"]).scores == [1.0]


@pytest.mark.timeout(60)
def test_scorer_processes_end_on_close(manager):
    manager.score(["s"] * 2, ["a", "b"], ["a", "b"])
    pids = manager.pool.live_pids()
    assert pids and all(alive(p) for p in pids)
    manager.close()
    assert not any(alive(p) for p in pids)
    assert os.getpid() not in pids
