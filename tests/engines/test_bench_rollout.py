"""``rlctl bench rollout`` runs both sides and reports consistent numbers (never asserts timings)."""

from __future__ import annotations

import json

from click.testing import CliRunner

from rlctl.cli.main import cli

TINY = ["--hidden-size", "32", "--layers", "1", "--vocab-size", "64", "--batch", "2", "--prompt-len", "4"]


def test_bench_rollout_json_reports_both_sides(device):
    args = ["bench", "rollout", "--json", *TINY, "--new-tokens", "3", "--repeats", "2", "--warmup", "0"]
    args += ["--device", device]
    result = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["tokens_per_call"] == 6
    assert len(data["engine_seconds"]) == len(data["generate_seconds"]) == 2
    assert data["engine_tokens_per_s"] > 0 and data["generate_tokens_per_s"] > 0
    assert abs(data["ratio"] - data["engine_tokens_per_s"] / data["generate_tokens_per_s"]) < 1e-9
    assert data["config"]["new_tokens"] == 3 and data["config"]["device"] == device


def test_bench_rollout_table_and_bad_flag():
    runner = CliRunner()
    result = runner.invoke(
        cli, ["bench", "rollout", *TINY, "--new-tokens", "2", "--repeats", "1", "--warmup", "0"]
    )
    assert result.exit_code == 0, result.output
    assert "ratio engine/generate" in result.output
    assert runner.invoke(cli, ["bench", "rollout", "--top-p", "1.5"]).exit_code == 2
