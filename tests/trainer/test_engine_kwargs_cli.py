"""``rollout.engine_kwargs`` through ``rlctl train``: a key no engine reads stops the run in one line
(exit 2) before any worker starts."""

from __future__ import annotations

from tests.cli_runner import run_cli


def test_engine_kwargs_for_the_hf_engine_exit_2_in_one_line(write_profile):
    path = write_profile(name="kw")
    code, _, err = run_cli("train", str(path), "--set", "rollout.engine_kwargs={max_model_len = 4096}")
    assert code == 2, err
    line = err.strip().splitlines()[-1]
    assert "rollout.engine_kwargs: set, but the hf rollout engine reads no engine keywords" in line
    assert "Traceback" not in err


def test_engine_kwargs_must_be_a_table(write_profile):
    code, _, err = run_cli(
        "profile", "check", str(write_profile(name="kw2")), "--set", "rollout.engine_kwargs=4"
    )
    assert code == 2 and "rollout.engine_kwargs: expected a table, got integer 4" in err
