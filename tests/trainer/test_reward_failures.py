"""A reward function that fails on too many samples stops the run, naming it, with its traceback."""

from __future__ import annotations

import textwrap

import pytest

from rlctl.errors import RunError
from rlctl.rewards import build_reward_manager
from tests.cli_runner import run_cli

BROKEN = textwrap.dedent(
    """
    def helper(text):
        raise RuntimeError("cannot parse " + text[:8])

    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        if solution_str.startswith("ok"):
            return 1.0
        return helper(solution_str)
    """
)


@pytest.fixture
def broken_fn(tmp_path):
    path = tmp_path / "broken_reward.py"
    path.write_text(BROKEN)
    return f"{path}:compute_score"


@pytest.mark.timeout(60)
def test_error_rate_above_the_limit_raises_naming_function_count_and_traceback(broken_fn):
    mgr = build_reward_manager("custom", function=broken_fn, num_workers=1, max_error_rate=0.25)
    try:
        with pytest.raises(RunError) as info:
            mgr.score(["s"] * 4, ["ok", "bad1", "bad2", "ok"], ["x"] * 4)
        headline, _, details = str(info.value).partition("\n")
        assert broken_fn in headline and "2 of 4 samples raised" in headline
        assert "RuntimeError: cannot parse bad1" in headline and "max_error_rate = 0.25" in headline
        assert "Traceback" in details and "in helper" in details  # the first sample's own traceback
        out = mgr.score(["s"] * 4, ["ok", "bad1", "ok", "ok"], ["x"] * 4)  # 1 of 4: at the limit, goes on
        assert out.scores == [1.0, 0.0, 1.0, 1.0] and out.metrics["reward/errors"] == 1.0
    finally:
        mgr.close()


def test_inline_verifier_errors_count_too():
    mgr = build_reward_manager("builtin")  # default limit 0.1
    with pytest.raises(
        RunError, match="reward builtin: 1 of 2 samples raised; first \\(nowhere\\): KeyError"
    ):
        mgr.score(["rlctl/addition", "nowhere"], ["4", "4"], ["4", "4"])


@pytest.mark.timeout(300)
def test_training_stops_at_the_first_step_when_the_reward_always_raises(write_profile, tmp_path, broken_fn):
    profile = write_profile("broken-reward", steps=3)
    profile.write_text(
        profile.read_text() + f'[reward]\nkind = "custom"\nfunction = "{broken_fn}"\ntimeout_s = 30\n'
    )
    code, _, err = run_cli("train", str(profile), "--set", "trainer.val_at_start=false")
    assert code == 1, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("rlctl: error: step 1: reward "), last
    assert broken_fn in last and "16 of 16 samples raised" in last and "RuntimeError: cannot parse" in last
    log = (tmp_path / "runs/broken-reward/error.log").read_text()
    assert "Traceback" in log and "in helper" in log
    assert (
        not (tmp_path / "runs/broken-reward/metrics.jsonl").exists()
        or "reward" not in (tmp_path / "runs/broken-reward/metrics.jsonl").read_text()
    )
