"""`rlctl report`: PNGs from a synthetic run, report.md, --json, --out, and clean exit 2 on bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from rlctl.report import build_report

ALL_PLOTS = ["reward", "val_accuracy", "kl", "entropy", "response_length", "timing", "optimization"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _rlctl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rlctl.cli.main", *args], capture_output=True, text=True, timeout=120
    )


def _check_png(path: Path) -> None:
    assert path.read_bytes()[:8] == PNG_MAGIC
    assert path.stat().st_size > 15_000  # axes, curves and text, not an empty canvas
    with Image.open(path) as img:
        img.verify()
    with Image.open(path) as img:
        assert img.width >= 600 and img.height >= 400
        assert len(img.convert("L").getcolors(maxcolors=1 << 16) or range(1 << 16)) > 50


def test_build_report_writes_every_plot_and_markdown(synthetic_run):
    report = build_report(synthetic_run)
    assert [p.name for p in report.plots] == [f"{n}.png" for n in ALL_PLOTS]
    assert report.skipped == []
    for path in report.plots:
        assert path.parent == synthetic_run / "plots"
        _check_png(path)
    md = (synthetic_run / "report.md").read_text()
    assert "![val_accuracy](plots/val_accuracy.png)" in md and "first at step 50" in md


def test_cli_prints_summary_and_json_with_out_dir(synthetic_run, tmp_path):
    lines = [json.loads(x) for x in (synthetic_run / "metrics.jsonl").read_text().splitlines()]
    clock = {r["step"]: r["train_time_s"] for r in lines if "train_time_s" in r}
    # val = 0.35 + 0.6 (1 - exp(-step/30)) reaches 0.8 between steps 41 and 42: first validation >= 0.8 is 50
    out = tmp_path / "elsewhere"
    proc = _rlctl("report", str(synthetic_run), "--out", str(out), "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["first_reach_step"] == 50
    assert data["first_reach_train_s"] == pytest.approx(clock[50])
    assert data["held_from_step"] == 50 and data["validations_held"] == 8
    assert data["steps"] == 120 and data["validations"] == 13
    assert data["report"] == str(out / "report.md")
    assert sorted(Path(p).name for p in data["plots"]) == sorted(f"{n}.png" for n in ALL_PLOTS)
    assert all(Path(p).parent == out for p in data["plots"])
    assert not (synthetic_run / "plots").exists()

    proc = _rlctl("report", str(synthetic_run))
    assert proc.returncode == 0, proc.stderr
    assert "first at step 50" in proc.stdout and "7 in" in proc.stdout
    assert (synthetic_run / "report.md").exists()


def test_missing_metrics_only_skip_their_plots(tmp_path):
    run = tmp_path / "bare"
    run.mkdir()
    (run / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": s, "reward/score_mean": s / 10}) + "\n" for s in range(1, 11))
    )
    # a stale KL plot from an earlier report must not survive as if it were current
    (run / "plots").mkdir()
    (run / "plots" / "kl.png").write_bytes(PNG_MAGIC)
    report = build_report(run)
    assert [p.name for p in report.plots] == ["reward.png"]
    assert set(report.skipped) == set(ALL_PLOTS) - {"reward"}
    assert not (run / "plots" / "kl.png").exists()
    _check_png(run / "plots" / "reward.png")


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, "metrics.jsonl: not found"),
        ("", "metrics.jsonl: empty"),
        ('{"step": 1, "x": 1.0}\n{"step": 2, x}\n', "metrics.jsonl:2: not valid JSON"),
    ],
)
def test_bad_metrics_exit_2_with_one_line_and_no_traceback(tmp_path, content, expected):
    if content is not None:
        (tmp_path / "metrics.jsonl").write_text(content)
    proc = _rlctl("report", str(tmp_path))
    assert proc.returncode == 2
    assert proc.stdout == ""
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and expected in err[0] and err[0].startswith("rlctl: error:")
    assert "Traceback" not in proc.stderr
