"""Summary numbers: first time at the target, held from, best/final, speed."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlctl.report import summarize, summary_text

VALS = {0: 0.30, 10: 0.70, 20: 0.82, 30: 0.78, 40: 0.85, 50: 0.90}


def _records(with_step_time=True):
    recs = [{"step": 0, "val/accuracy": VALS[0]}]
    for s in range(1, 51):
        rec = {
            "step": s,
            "train_time_s": 0.25 * s,
            "reward/score_mean": s / 50,
            "perf/tokens_per_s": 100.0 + s,
        }
        if with_step_time:
            rec["time/step"] = 0.5 if s % 2 else 0.25  # includes more than the training clock
        if s in VALS:
            rec["val/accuracy"] = VALS[s]
        recs.append(rec)
    return recs


def test_summary_of_a_known_run():
    s = summarize(_records(), threshold=0.8)
    assert (s.steps, s.first_step, s.last_step) == (50, 1, 50)
    assert s.train_time_s == pytest.approx(12.5)
    assert s.validations == 6
    assert (s.initial_val_accuracy, s.final_val_accuracy) == (0.30, 0.90)
    assert (s.best_val_accuracy, s.best_val_step) == (0.90, 50)
    assert (s.first_reach_step, s.first_reach_train_s) == (20, pytest.approx(5.0))
    assert (s.held_from_step, s.held_from_train_s, s.validations_held) == (40, pytest.approx(10.0), 2)
    assert s.mean_s_per_step == pytest.approx(0.375)
    assert s.mean_tokens_per_s == pytest.approx(100 + 25.5)
    assert s.final_reward_mean == pytest.approx(sum(range(41, 51)) / 10 / 50)
    text = summary_text(s)
    assert "first at step 20 (5.0 s of training)" in text and "held from step 40" in text


def test_speed_falls_back_to_the_training_clock_and_threshold_is_a_parameter():
    s = summarize(_records(with_step_time=False), threshold=0.95)
    assert s.mean_s_per_step == pytest.approx(0.25)
    assert s.first_reach_step is None and s.held_from_step is None and s.validations_held == 0
    assert "never reached" in summary_text(s)


def test_a_run_without_validation_or_clock():
    s = summarize([{"step": 1, "reward/score_mean": 0.5}, {"step": 2, "reward/score_mean": 1.0}])
    assert s.steps == 2 and s.validations == 0 and s.best_val_accuracy is None
    assert s.train_time_s is None and s.mean_s_per_step is None
    assert "no validation recorded" in summary_text(s)


def test_reaching_the_target_at_the_initial_validation_counts_zero_seconds():
    recs = [{"step": 0, "val/accuracy": 0.9}, {"step": 1, "train_time_s": 1.0, "val/accuracy": 0.95}]
    s = summarize(recs)
    assert (s.first_reach_step, s.first_reach_train_s, s.held_from_step, s.validations_held) == (0, 0.0, 0, 2)


@given(accs=st.lists(st.floats(0, 1), min_size=1, max_size=30), thr=st.floats(0.05, 0.95))
def test_first_reach_and_held_from_match_their_definitions(accs, thr):
    recs = [{"step": 5 * i, "train_time_s": 2.0 * i, "val/accuracy": a} for i, a in enumerate(accs)]
    s = summarize(recs, threshold=thr)
    reached = [i for i, a in enumerate(accs) if a >= thr]
    assert s.first_reach_step == (5 * reached[0] if reached else None)
    if s.held_from_step is None:
        assert accs[-1] < thr
    else:
        i = s.held_from_step // 5
        assert all(a >= thr for a in accs[i:]) and (i == 0 or accs[i - 1] < thr)
        assert s.validations_held == len(accs) - i
        assert math.isclose(s.held_from_train_s, 2.0 * i)
    assert s.best_val_accuracy == max(accs)
