"""Answer gaming and stalls: each case passed (scored 1.0) or stalled the reward step before.

``numeric`` accepted 1000001 for 1000000 (1e-6 relative); ``math`` scored ``\\boxed{4 = 3}`` and
``\\boxed{\\cancel{4} 3}`` as 3; the code-fence regex was quadratic in a run of backticks; a power
tower kept a math scorer busy for seconds and gigabytes. Timings are ratios measured in the same
process (robust on a loaded host), never absolute seconds alone.
"""

from __future__ import annotations

import re
import statistics
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlctl.rewards.answers import costly
from rlctl.rewards.code import extract_code
from rlctl.rewards.limits import OverLimit
from rlctl.rewards.manager import RewardManager, build_reward_manager
from rlctl.rewards.verifiers import math_match, numeric_match

TOWER = "so the answer is $\\boxed{9^{9^{9^{9}}}}$"
BACKTICKS = "`" * 80_000


@pytest.mark.parametrize(
    ("text", "truth", "score"),
    [
        ("1000001", "1000000", 0.0),
        ("123456800", 123456789, 0.0),
        ("1000000.5", 1000000, 0.0),
        ("1000001.0", "1000000", 0.0),
        ("1,000,000", 1000000, 1.0),
        ("1e6", "1000000", 1.0),
        ("42", 42.0, 1.0),
        ("0.3333334", "0.3333333", 1.0),  # a fractional truth may be rounded: the tolerance stays
        ("1e999999999", "5", 0.0),
    ],
)
def test_numeric_compares_integers_exactly(text, truth, score):
    assert numeric_match("s", text, truth) == score


@pytest.mark.parametrize(
    ("text", "score"),
    [
        ("\\boxed{4 = 3}", 0.0),
        ("\\boxed{3 = 4}", 0.0),
        ("\\boxed{\\cancel{4} 3}", 0.0),
        ("\\boxed{\\sout{4} 3}", 0.0),
        ("\\boxed{x = 3}", 1.0),
        ("\\boxed{3 = 3}", 1.0),
        ("\\boxed{3}", 1.0),
    ],
)
def test_math_scores_a_contradictory_answer_zero(text, score):
    assert math_match("m", text, "3") == score


def test_math_compares_a_costly_answer_as_text_only():
    assert costly("9^{9^{9^{9}}}") and costly("2^{100000}") and costly("1000!") and costly("9**9**9")
    assert not costly("x^{2}y^{3}") and not costly("2^{10}") and not costly("e^{i\\pi}")
    assert math_match("m", "\\boxed{2^{2^{3}}}", "2^{2^{3}}") == 1.0  # written the same: no evaluation
    start = time.perf_counter()
    with pytest.raises(OverLimit):
        math_match("m", TOWER, "3")
    assert time.perf_counter() - start < 1.0  # refused before sympy; it took 5 s (its own alarm) before


_OLD_FENCE = re.compile(r"```(?:python|py|python3)?[^\n]*\n(.*?)```", re.DOTALL)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="`\npy x", max_size=40))
def test_the_linear_fence_scan_finds_what_the_regex_found(text):
    blocks = _OLD_FENCE.findall(text)
    assert extract_code(text) == (blocks[-1] if blocks else text)


def _best_of(fn, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def test_the_fence_scan_is_linear_in_a_run_of_backticks():
    small = _best_of(lambda: extract_code("`" * 8_000))
    large = _best_of(lambda: extract_code(BACKTICKS))
    # 10x the input: a linear scan costs ~10x, the old regex ~100x (80k: 3.9 s)
    assert large < 30 * small + 0.01, (small, large)
    assert extract_code(BACKTICKS) == BACKTICKS


def _math_batch(n: int, bad: list[str]) -> tuple[list[str], list[str], list[str]]:
    good = [f"so {i} + 1 is $\\boxed{{{i + 1}}}$" for i in range(n - len(bad))]
    solutions = good + bad
    truths = [str(i + 1) for i in range(len(good))] + ["3"] * len(bad)
    return ["math"] * n, solutions, truths


@pytest.mark.timeout(300)
def test_a_pathological_sample_costs_a_batch_about_one_sample():
    """200 math samples with a power tower and 80k backticks among them: both score 0, are counted
    in reward/over_limit (not errors), and the batch takes about as long as one without them."""
    manager = build_reward_manager("math", num_workers=2)
    try:
        plain = _math_batch(200, [])
        hostile = _math_batch(200, [TOWER, BACKTICKS])
        manager.score(*plain)  # workers started and warm
        t_plain = statistics.median(_best_of(lambda: manager.score(*plain), 1) for _ in range(3))
        start = time.perf_counter()
        out = manager.score(*hostile)
        t_hostile = time.perf_counter() - start
    finally:
        manager.close()
    assert out.scores[-2:] == [0.0, 0.0] and sum(out.scores[:-2]) == 198.0
    assert out.metrics["reward/over_limit"] == 1.0  # the tower; the backticks simply have no answer
    assert out.metrics["reward/errors"] == 0.0 and out.metrics["reward/timeouts"] == 0.0
    # within 2 s of the plain batch, and proportionally: two more samples of 200 cost ~1%
    assert t_hostile - t_plain < 2.0 or t_hostile < 1.25 * t_plain, (t_plain, t_hostile)


def _allocates(data_source, solution_str, ground_truth, extra_info=None):
    blob = bytearray(int(solution_str) << 20)  # the sample's size in MiB
    return float(len(blob) > 0)


def test_a_scorer_process_past_its_memory_limit_scores_zero_and_the_step_goes_on():
    manager = RewardManager(_allocates, "custom", timeout_s=30.0, num_workers=1, name="alloc", data_limit_mb=1024)
    try:
        out = manager.score(["s"] * 3, ["1", "4096", "1"], [None] * 3)
    finally:
        manager.close()
    assert out.scores == [1.0, 0.0, 1.0]
    assert out.metrics["reward/over_limit"] == 1.0 and out.metrics["reward/errors"] == 0.0
