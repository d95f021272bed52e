"""Custom reward functions from a file, and the RewardManager's error/timeout accounting."""

from __future__ import annotations

import re
import textwrap
import time

import pytest

from rlctl.errors import RunError, UserError
from rlctl.rewards import RewardManager, build_reward_manager, load_custom_reward
from rlctl.rewards.custom import parse_function_spec

USER_FN = textwrap.dedent(
    """
    import time

    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        if solution_str == "boom":
            raise RuntimeError("user bug")
        if solution_str == "slow":
            time.sleep(30)
        if solution_str == "nan":
            return float("nan")
        if solution_str == "dict":
            return {"score": 0.5, "acc": 1.0, "pred": "d"}
        if solution_str == "nokey":
            return {"value": 1}
        return float(solution_str.strip() == ground_truth[::-1])

    def two_args(a, b):
        return 0.0
    """
)


@pytest.fixture
def fn_file(tmp_path):
    p = tmp_path / "my_reward.py"
    p.write_text(USER_FN)
    return p


def test_spec_parsing():
    assert parse_function_spec("a/b.py:fn") == (__import__("pathlib").Path("a/b.py"), "fn")
    assert parse_function_spec("a/b.py")[1] == "compute_score"


def test_load_and_call(fn_file, tmp_path):
    fn = load_custom_reward(f"{fn_file}:compute_score")
    assert fn("s", "cba", "abc", {}) == 1.0
    rel = load_custom_reward("my_reward.py", base_dir=tmp_path)  # relative to the profile's directory
    assert rel("s", "x", "y", {}) == 0.0


def test_load_errors_name_the_file_and_function(fn_file, tmp_path):
    with pytest.raises(UserError, match="not found: .*missing.py"):
        load_custom_reward(str(tmp_path / "missing.py:f"))
    with pytest.raises(UserError, match="'nope' not found in .*my_reward.py"):
        load_custom_reward(f"{fn_file}:nope")
    with pytest.raises(UserError, match="must accept"):
        load_custom_reward(f"{fn_file}:two_args")
    broken = tmp_path / "broken.py"
    broken.write_text("raise ImportError('x')\n")
    with pytest.raises(UserError, match="failed to import: ImportError"):
        load_custom_reward(str(broken))


@pytest.mark.timeout(60)
def test_manager_counts_errors_and_timeouts_and_keeps_going(fn_file):
    mgr = build_reward_manager(
        "custom", function=f"{fn_file}:compute_score", timeout_s=0.5, num_workers=2, max_error_rate=1.0
    )
    sols = ["cba", "boom", "slow", "nan", "dict", "nokey", "xyz"]
    start = time.monotonic()
    out = mgr.score(["s"] * 7, sols, ["abc"] * 7, [{}] * 7)
    assert time.monotonic() - start < 25  # did not wait for the sleeping sample
    assert out.scores == [1.0, 0.0, 0.0, 0.0, 0.5, 0.0, 0.0]
    assert out.acc == [1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0]
    assert out.metrics["reward/errors"] == 3.0  # boom, nan, nokey
    assert out.metrics["reward/timeouts"] == 1.0
    assert out.extra["pred"] == [None, None, None, None, "d", None, None]
    again = mgr.score(["s"], ["boom"], ["abc"])
    assert again.metrics["reward/errors"] == 1.0 and again.metrics["reward/timeouts"] == 0.0


def test_inline_manager_for_builtin_tasks():
    mgr = build_reward_manager("builtin", max_error_rate=0.5)
    out = mgr.score(["rlctl/addition", "rlctl/reverse", "unknown"], ["46", "21", "1"], ["46", "21", "1"])
    assert out.scores == [1.0, 1.0, 0.0]
    assert out.metrics["reward/errors"] == 1.0 and out.metrics["reward/acc"] == pytest.approx(2 / 3)


def test_config_errors():
    with pytest.raises(UserError, match="needs reward.function"):
        build_reward_manager("custom")
    with pytest.raises(UserError, match="unknown"):
        build_reward_manager("telepathy")
    with pytest.raises(UserError, match="needs reward.model_path"):
        build_reward_manager("reward_model")
    with pytest.raises(UserError, match="unknown"):
        RewardManager(None, "telepathy")


BAD_VALUES_FN = textwrap.dedent(
    """
    import numpy as np

    VALUES = {
        "huge": 1e39, "string": "1", "bool": True, "nan_acc": {"score": 0.5, "acc": float("nan")},
        "huge_extra": {"score": 1.0, "margin": -1e39},
        "np32": np.float32(0.25), "int": 1, "ok_dict": {"score": 0.5, "timed_out": False, "pred": "7"},
    }

    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        return VALUES[solution_str]
    """
)


@pytest.mark.timeout(60)
def test_reward_values_must_be_numbers_finite_in_float32(tmp_path):
    path = tmp_path / "bad_values.py"
    path.write_text(BAD_VALUES_FN)
    mgr = build_reward_manager("custom", function=f"{path}:compute_score", num_workers=1, max_error_rate=1.0)
    sols = ["huge", "string", "bool", "nan_acc", "huge_extra", "np32", "int", "ok_dict"]
    out = mgr.score(["s"] * len(sols), sols, ["x"] * len(sols))
    assert out.scores == [0.0, 0.0, 0.0, 0.0, 0.0, 0.25, 1.0, 0.5]
    assert out.metrics["reward/errors"] == 5.0
    strict = build_reward_manager(
        "custom", function=f"{path}:compute_score", num_workers=1, max_error_rate=0.0
    )
    for sol, needle in [
        ("huge", "'score' is 1e+39: not finite in float32"),
        ("string", "'score' must be a number, got str '1'"),
        ("bool", "'score' must be a number, got bool True"),
        ("nan_acc", "'acc' is nan"),
        ("huge_extra", "'margin' is -1e+39"),
    ]:
        with pytest.raises(RunError, match=re.escape(needle)):
            strict.score(["s"], [sol], ["x"])
