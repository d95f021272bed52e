"""The shipped real-model profile learns: held-out accuracy rises by at least 30 points.

Slow (about a quarter of an hour on a 2-core CPU): run with ``pytest -m slow``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli_runner import run_cli

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_smollm2_profile_gains_30_points(smollm2_dir, tmp_path):
    code, _, err = run_cli(
        "--log-format", "plain", "train", str(REPO / "profiles/smollm2-cpu.toml"),
        "--set", f"model.path={smollm2_dir}", "--set", "cluster.backend=inprocess",
        "--output-dir", str(tmp_path),
    )  # fmt: skip
    assert code == 0, err
    records = [json.loads(x) for x in (tmp_path / "smollm2-cpu/metrics.jsonl").read_text().splitlines()]
    curve = [r["val/accuracy"] for r in records if "val/accuracy" in r]
    assert max(curve[1:]) - curve[0] >= 0.30, curve
