"""metrics.jsonl: valid lines flushed as written, fresh vs resumed runs, no duplicate steps."""

from __future__ import annotations

import json
import math

import numpy as np
import torch
from hypothesis import given
from hypothesis import strategies as st

from rlctl.tracking import Tracker
from rlctl.tracking.jsonl import FILENAME, truncate_after


def _records(run_dir):
    return [json.loads(line) for line in (run_dir / FILENAME).read_text().splitlines()]


def _tracker(run_dir, resume=False, **kw):
    return Tracker(run_dir, ["jsonl"], "t", {}, total_steps=10, resume=resume, **kw)


def test_lines_are_valid_json_and_flushed_before_close(tmp_path):
    tr = _tracker(tmp_path)
    tr.log({"reward/score_mean": 0.25, "actor/kl": np.float32(0.5), "actor/lr": torch.tensor(3e-5)}, step=1)
    tr.log({"val/accuracy": 0.75, "reward/errors": 2, "actor/grad_norm": math.nan}, step=2)
    recs = _records(tmp_path)  # read while the tracker is still open: each line is flushed
    assert recs[0] == {"step": 1, "reward/score_mean": 0.25, "actor/kl": 0.5, "actor/lr": recs[0]["actor/lr"]}
    assert math.isclose(recs[0]["actor/lr"], 3e-5, rel_tol=1e-6)
    assert recs[1] == {"step": 2, "val/accuracy": 0.75, "reward/errors": 2, "actor/grad_norm": None}
    assert list(recs[1])[0] == "step"
    tr.close()
    tr.close()  # idempotent


def test_non_number_metric_is_rejected_by_name(tmp_path):
    with _tracker(tmp_path) as tr:
        try:
            tr.log({"oops": "text"}, step=1)
        except TypeError as exc:
            assert "oops" in str(exc)
        else:
            raise AssertionError("a string metric must be rejected")


def test_fresh_run_overwrites_old_history(tmp_path):
    with _tracker(tmp_path) as tr:
        for s in range(1, 6):
            tr.log({"x": s}, step=s)
    with _tracker(tmp_path) as tr:
        tr.log({"x": 100}, step=1)
    assert _records(tmp_path) == [{"step": 1, "x": 100}]


def test_resume_with_known_step_truncates_at_once(tmp_path):
    with _tracker(tmp_path) as tr:
        for s in range(0, 8):
            tr.log({"x": s}, step=s)
    tr = _tracker(tmp_path, resume=True, resume_step=4)
    assert [r["step"] for r in _records(tmp_path)] == [0, 1, 2, 3, 4]
    for s in range(5, 8):
        tr.log({"x": 10 * s}, step=s)
    tr.close()
    recs = _records(tmp_path)
    assert [r["step"] for r in recs] == list(range(8))
    assert [r["x"] for r in recs] == [0, 1, 2, 3, 4, 50, 60, 70]


def test_resume_without_step_truncates_at_first_log(tmp_path):
    with _tracker(tmp_path) as tr:
        for s in range(1, 7):
            tr.log({"x": s}, step=s)
    with open(tmp_path / FILENAME, "a") as fh:
        fh.write('{"step": 7, "x"')  # a half-written line of a killed run
    tr = _tracker(tmp_path, resume=True)
    assert len(_records_raw := (tmp_path / FILENAME).read_text().splitlines()) == 7  # untouched until log
    assert _records_raw[-1].startswith('{"step": 7')
    tr.log({"x": -3}, step=3)
    tr.close()
    assert [(r["step"], r["x"]) for r in _records(tmp_path)] == [(1, 1), (2, 2), (3, -3)]


@given(
    old_steps=st.lists(st.integers(0, 50), max_size=30),
    resume_at=st.integers(-1, 50),
    n_new=st.integers(0, 10),
)
def test_resumed_file_never_holds_duplicate_or_stale_steps(tmp_path_factory, old_steps, resume_at, n_new):
    run_dir = tmp_path_factory.mktemp("run")
    old_steps = sorted(set(old_steps))
    with _tracker(run_dir) as tr:
        for s in old_steps:
            tr.log({"x": 1.0}, step=s)
    with _tracker(run_dir, resume=True, resume_step=resume_at) as tr:
        new = list(range(resume_at + 1, resume_at + 1 + n_new))
        for s in new:
            tr.log({"x": 2.0}, step=s)
    recs = _records(run_dir) if (run_dir / FILENAME).read_text() else []
    steps = [r["step"] for r in recs]
    assert len(steps) == len(set(steps))
    assert steps == [s for s in old_steps if s <= resume_at] + new
    assert all(r["x"] == 2.0 for r in recs if r["step"] > resume_at)


def test_truncate_after_on_missing_file_is_a_noop(tmp_path):
    assert truncate_after(tmp_path / FILENAME, 3) == 0
    assert not (tmp_path / FILENAME).exists()
