"""Tracker fan-out: logger names, optional backends that are missing, console output, failing sinks."""

from __future__ import annotations

import io
import json
import re
import sys

import pytest
from structlog.testing import capture_logs

from rlctl.errors import UserError
from rlctl.tracking import VALID_LOGGERS, Tracker
from rlctl.tracking import optional as optional_mod


def _make(run_dir, loggers, **kw):
    kw.setdefault("console_mode", "lines")
    return Tracker(run_dir, loggers, "run-a", {"lr": 1e-5}, total_steps=25, resume=False, **kw)


def test_unknown_logger_is_a_user_error_listing_valid_ones(tmp_path):
    with pytest.raises(UserError) as err:
        _make(tmp_path, ["jsonl", "mlflow"])
    msg = str(err.value)
    assert "'mlflow'" in msg and "trainer.loggers" in msg
    assert all(name in msg for name in VALID_LOGGERS)
    assert "\n" not in msg


@pytest.fixture
def no_dashboards(monkeypatch):
    """Make tensorboard and wandb unimportable, as on a machine without them."""
    for mod in [m for m in sys.modules if m.startswith(("torch.utils.tensorboard", "tensorboard", "wandb"))]:
        monkeypatch.delitem(sys.modules, mod)
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    monkeypatch.setitem(sys.modules, "wandb", None)
    monkeypatch.setattr(optional_mod, "_warned", set())


@pytest.mark.parametrize("name", ["tensorboard", "wandb"])
def test_missing_dashboard_warns_once_and_the_run_goes_on(tmp_path, no_dashboards, name):
    with capture_logs() as logs:
        first = _make(tmp_path / "a", ["jsonl", name])
        second = _make(tmp_path / "b", [name, "jsonl"])
    assert list(first.backends) == ["jsonl"] and list(second.backends) == ["jsonl"]
    warnings = [e for e in logs if e["log_level"] == "warning"]
    assert len(warnings) == 1
    assert name in warnings[0]["event"] and "pip install" in warnings[0]["fix"]
    first.log({"reward/score_mean": 1.0}, step=1)
    first.close()
    second.close()
    assert json.loads((tmp_path / "a" / "metrics.jsonl").read_text()) == {"step": 1, "reward/score_mean": 1.0}


def test_console_lines_every_n_steps_last_step_and_validation(tmp_path):
    with capture_logs() as logs:
        tr = _make(tmp_path, ["console"], console_every=10)
        for step in range(1, 26):
            metrics = {"reward/score_mean": step / 25, "time/step": 0.5, "perf/tokens_per_s": 1000.0}
            if step == 13:
                metrics["val/accuracy"] = 0.625
            tr.log(metrics, step=step)
            if step == 20:  # validation logged in its own call after the step's metrics
                tr.log({"val/accuracy": 0.75}, step=step)
        tr.close()
    vals = [e for e in logs if e["event"] == "validation"]
    assert [(e["step"], e["val_acc"]) for e in vals] == [("20/25", "0.750")]
    lines = [e for e in logs if e["event"] == "progress"]
    assert [e["step"] for e in lines] == ["10/25", "13/25", "20/25", "25/25"]
    assert lines[-1]["reward"] == "1.000"
    assert lines[1]["val_acc"] == "0.625"
    assert lines[-1]["val_acc"] == "0.750"
    assert lines[-1]["s_per_step"] == "0.500"
    assert "val_acc" not in lines[0]


def test_console_bar_on_a_terminal_shows_step_reward_and_val(tmp_path):
    from rich.console import Console

    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=200, color_system=None)
    tr = Tracker(tmp_path, ["console"], "bar-run", {}, total_steps=4, resume=False, console=console)
    assert tr.backends["console"].mode == "bar"
    for step in range(1, 5):
        tr.log({"reward/score_mean": 0.25 * step, "reward/accuracy": 0.5, "time/step": 0.125}, step=step)
    tr.log({"val/accuracy": 0.875}, step=4)
    tr.close()
    out = buf.getvalue()
    assert "4/4" in out and "bar-run" in out
    assert "reward 1.000" in out and "val 0.875" in out and "0.125 s/step" in out


class _Exploding:
    def log(self, metrics, step):
        raise OSError("dashboard server gone")

    def close(self):
        pass


def test_a_failing_dashboard_is_dropped_but_jsonl_keeps_recording(tmp_path):
    tr = _make(tmp_path, ["jsonl"])
    tr.backends["wandb"] = _Exploding()
    with capture_logs() as logs:
        tr.log({"x": 1.0}, step=1)
        tr.log({"x": 2.0}, step=2)
    tr.close()
    assert sum(1 for e in logs if e["log_level"] == "warning") == 1
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 2


def test_tensorboard_writes_scalars_when_installed(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with _make(tmp_path, ["tensorboard"]) as tr:
        for step in range(1, 4):
            tr.log({"reward/score_mean": step * 0.5, "actor/kl": None}, step=step)
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    events = acc.Scalars("reward/score_mean")
    assert [(e.step, e.value) for e in events] == [(1, 0.5), (2, 1.0), (3, 1.5)]
    assert "actor/kl" not in acc.Tags()["scalars"]

    # resume from step 1: the interrupted run's steps 2..3 are purged, the new ones replace them
    with Tracker(tmp_path, ["tensorboard"], "run-a", {}, total_steps=5, resume=True, resume_step=1) as tr:
        tr.log({"reward/score_mean": 9.0}, step=2)
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("reward/score_mean")] == [(1, 0.5), (2, 9.0)]


def test_wandb_offline_run_is_continued_on_resume_when_installed(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")  # never reaches the network; mode comes from wandb's env
    monkeypatch.setenv("WANDB_SILENT", "true")
    with _make(tmp_path, ["wandb", "jsonl"]) as tr:
        assert list(tr.backends) == ["wandb", "jsonl"]
        tr.log({"reward/score_mean": 0.5, "actor/kl": None}, step=1)
    run_id = (tmp_path / "wandb_id").read_text().strip()
    with Tracker(tmp_path, ["wandb"], "run-a", {}, total_steps=5, resume=True, resume_step=1) as tr:
        tr.log({"reward/score_mean": 0.75}, step=2)
    assert (tmp_path / "wandb_id").read_text().strip() == run_id
    runs = sorted(p.name for p in (tmp_path / "wandb").glob("offline-run-*"))
    # wandb names a run directory offline-run-<time>-<id>, adding "-1" when both runs start in one second
    assert len(runs) == 2 and all(re.search(rf"-{run_id}(-\d+)?$", name) for name in runs)
