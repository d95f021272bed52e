"""`rlctl bench endpoint` runs both sides on the same engine and checks their trajectories (the
speed ratio itself is a measurement for the docs, not asserted here)."""

from __future__ import annotations

import json

import pytest

from tests.cli_runner import run_cli

pytest.importorskip(
    "openai", reason="the endpoint's client is the openai package: pip install 'rlctl[agent]'"
)


def test_bench_endpoint_batches_one_call_per_turn_against_one_per_request():
    code, out, err = run_cli(
        "bench",
        "endpoint",
        "--episodes",
        "6",
        "--turns",
        "2",
        "--answer-tokens",
        "4",
        "--repeats",
        "1",
        "--json",
    )
    assert code == 0, err
    result = json.loads(out[out.index("{") :])
    assert result["requests"] == 12
    assert result["batched"]["engine_calls"] == 2 and result["serial"]["engine_calls"] == 12
    assert result["batched"]["complete_and_exact"] and result["serial"]["complete_and_exact"]
    assert result["ratio"] > 0
