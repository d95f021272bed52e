"""``rlctl bench dispatch --json``: runs end to end on tiny sizes and reports every side and ratio.

Timings are not asserted (benchmarks are commands); only that each case was measured.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from rlctl.cli.bench_dispatch import command

pytestmark = [pytest.mark.ray, pytest.mark.timeout(180)]


def test_bench_dispatch_json_reports_each_case(ray_session):
    result = CliRunner().invoke(
        command, ["--json", "--sizes-mb", "0.05", "--workers", "1,2", "--repeats", "2"]
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert [(r["workers"], r["size_mb"]) for r in data["rows"]] == [(1, 0.05), (2, 0.05)]
    for row in data["rows"]:
        for side in ("dispatch", "raw_round_trip", "raw_put_get"):
            assert row[f"{side}_s"] > 0 and len(row["samples"][side]) == 2
        assert row["ratio_vs_round_trip"] == pytest.approx(row["dispatch_s"] / row["raw_round_trip_s"])
    assert ray_session.is_initialized()  # the bench reused the session's Ray and left it running


def test_bench_dispatch_rejects_bad_worker_counts():
    result = CliRunner().invoke(command, ["--workers", "0"])
    assert result.exit_code != 0 and "positive integers" in result.output
