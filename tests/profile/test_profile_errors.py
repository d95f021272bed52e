"""Every kind of bad profile input exits 2 with one line naming the problem, no traceback."""

from __future__ import annotations

import string
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.cli_runner import run_cli

GOOD = """
[model]
path = "m"
[actor]
lr = 1e-5
[trainer]
prompts_per_step = 8
"""


def write(tmp_path: Path, text: str, name: str = "p.toml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def assert_user_error(args: list[str], *needles: str) -> str:
    code, out, err = run_cli(*args)
    assert code == 2, (code, out, err)
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def test_good_profile_checks(tmp_path):
    code, out, err = run_cli("profile", "check", write(tmp_path, GOOD))
    assert code == 0, err


def test_malformed_toml_gives_line_and_column(tmp_path):
    text = GOOD + "[broken\nx = 1\n"
    p = write(tmp_path, text)
    line = assert_user_error(["profile", "check", p], p)
    broken_line = text.splitlines().index("[broken") + 1
    assert f"p.toml:{broken_line}:" in line, line


def test_unknown_key_with_suggestion(tmp_path):
    p = write(tmp_path, GOOD.replace("lr = 1e-5", "lrr = 1e-5"))
    assert_user_error(["profile", "show", p], p, "actor.lrr", "did you mean 'actor.lr'")


def test_unknown_section(tmp_path):
    p = write(tmp_path, GOOD + "\n[trainr]\nsteps = 3\n")
    assert_user_error(["profile", "show", p], "trainr", "did you mean 'trainer'")


@pytest.mark.parametrize(
    ("key", "value", "expect"),
    [
        ("actor.lr", '"fast"', "expected a number"),
        ("trainer.steps", "1.5", "expected an integer"),
        ("data.shuffle", "1", "expected true or false"),
        ("run.name", "3", "expected a string"),
        ("trainer.loggers", '"jsonl"', "expected a list"),
    ],
)
def test_wrong_type(tmp_path, key, value, expect):
    p = write(tmp_path, GOOD)
    assert_user_error(["profile", "show", p, "--set", f"{key}={value}"], key, expect)


@pytest.mark.parametrize(
    ("key", "value", "expect"),
    [
        ("actor.lr", "-1e-5", "> 0"),
        ("trainer.prompts_per_step", "0", ">= 1"),
        ("rollout.top_p", "1.5", "<= 1"),
        ("cluster.backend", '"mpi"', "one of"),
    ],
)
def test_out_of_range(tmp_path, key, value, expect):
    p = write(tmp_path, GOOD)
    assert_user_error(["profile", "check", p, "--set", f"{key}={value}"], key, expect)


def test_out_of_range_in_file_names_file(tmp_path):
    p = write(tmp_path, GOOD.replace("lr = 1e-5", "lr = -2.0"))
    assert_user_error(["profile", "check", p], p, "actor.lr")


def test_missing_profile(tmp_path):
    assert_user_error(["profile", "show", str(tmp_path / "nope.toml")], "nope.toml", "not found")


def test_missing_extends(tmp_path):
    p = write(tmp_path, 'extends = "base.toml"\n' + GOOD)
    assert_user_error(["profile", "show", p], "extends", "base.toml")


def test_cyclic_extends(tmp_path):
    write(tmp_path, 'extends = "b.toml"\n', "a.toml")
    write(tmp_path, 'extends = "a.toml"\n', "b.toml")
    assert_user_error(["profile", "show", str(tmp_path / "a.toml")], "cyclic")


@pytest.mark.parametrize("bad", ["actor.lr", "=3", "actor..lr=1", "actor.lr=[1,", "a b=1"])
def test_unparsable_set(tmp_path, bad):
    assert_user_error(["profile", "show", write(tmp_path, GOOD), "--set", bad], "--set")


def test_cross_field_mini_batch_must_divide(tmp_path):
    p = write(tmp_path, GOOD.replace("lr = 1e-5", "lr = 1e-5\nmini_batch_prompts = 3"))
    assert_user_error(["profile", "check", p], "actor.mini_batch_prompts", "divisor")


def test_unknown_preset(tmp_path):
    p = write(tmp_path, GOOD + '\n[algorithm]\npreset = "grpoo"\n')
    assert_user_error(["profile", "check", p], "grpoo", "did you mean 'grpo'")


_TOKENS = st.sampled_from(
    [
        "[",
        "]",
        "=",
        '"',
        "lr",
        "actor",
        "trainer",
        "steps",
        "-1",
        "0",
        "1e9",
        "\n",
        " ",
        ".",
        "x",
        "true",
        "{",
    ]
)


@given(
    cut=st.integers(min_value=0, max_value=len(GOOD)),
    insert=st.lists(_TOKENS, min_size=1, max_size=4).map("".join),
)
def test_mutated_profiles_never_traceback(tmp_path_factory, cut, insert):
    text = GOOD[:cut] + insert + GOOD[cut:]
    path = tmp_path_factory.mktemp("mut") / "p.toml"
    path.write_text(text)
    code, out, err = run_cli("profile", "check", str(path))
    assert "Traceback" not in err
    assert code in (0, 2), err
    if code == 2:
        assert len(err.strip().splitlines()) == 1, err


@given(
    key=st.text(alphabet=string.ascii_lowercase + "._", min_size=1, max_size=12), value=st.text(max_size=8)
)
def test_random_set_overrides_never_traceback(tmp_path_factory, key, value):
    path = tmp_path_factory.mktemp("set") / "p.toml"
    path.write_text(GOOD)
    code, out, err = run_cli("profile", "check", str(path), "--set", f"{key}={value}")
    assert "Traceback" not in err
    assert code in (0, 2), err


@pytest.mark.parametrize("name", ["../other", "/tmp/elsewhere", "a/b", "..", ".hidden", "", "x" * 200])
def test_run_name_that_leaves_the_output_dir_is_refused(tmp_path, name):
    """run.name is a directory name under run.output_dir, never a path."""
    p = write(tmp_path, f'[run]\nname = "{name}"\n' + GOOD)
    assert_user_error(["profile", "check", p], p, "run.name", "plain name")
    assert_user_error(["train", p], "run.name")  # refused before anything is written
    assert not (tmp_path / "runs").exists() and not (tmp_path.parent / "other").exists()


@pytest.mark.parametrize("name", ["tiny-cpu", "qwen2.5_7b-grpo", "Run1"])
def test_plain_run_names_are_accepted(tmp_path, name):
    code, out, err = run_cli("profile", "check", write(tmp_path, f'[run]\nname = "{name}"\n' + GOOD))
    assert code == 0, err


@pytest.mark.parametrize(
    ("sets", "key"),
    [
        (["rollout.engine=vllm"], "rollout.engine"),
        (["rollout.tensor_parallel=2", "cluster.devices_per_node=2"], "rollout.tensor_parallel"),
        (["cluster.devices_per_node=2"], "cluster.devices_per_node"),
    ],
)
def test_delta_sync_where_it_cannot_run_is_refused_naming_the_key(tmp_path, sets, key):
    """rollout.delta_sync is read by the HF engine's one-rank colocated sync and the off-policy
    pushes; anywhere else it would sit unread, so it is refused."""
    p = write(tmp_path, GOOD)
    args = ["profile", "check", p, "--set", "rollout.delta_sync=true"]
    for s in sets:
        args += ["--set", s]
    assert_user_error(args, f"{key}: rollout.delta_sync = true")


def test_delta_sync_with_two_ranks_off_policy_is_accepted(tmp_path):
    p = write(tmp_path, GOOD)
    code, _, err = run_cli(
        "profile", "check", p, "--set", "rollout.delta_sync=true", "--set", "cluster.devices_per_node=2",
        "--set", "trainer.mode=async",
    )
    assert code == 0, err


@pytest.mark.parametrize(
    ("mode", "sets", "key"),
    [
        ("swap", ["trainer.mode=one_step_off", "cluster.backend=inprocess"], "trainer.mode"),
        ("carry", ["trainer.mode=sync"], "trainer.mode"),
        ("swap", ["trainer.mode=async", "cluster.backend=inprocess", "rollout.engine=vllm"], "rollout.engine"),
        ("carry", ["trainer.mode=async", "rollout.engine=sglang"], "rollout.engine"),
        ("swap", ["trainer.mode=async", "cluster.backend=inprocess", "rollout.delta_sync=true"], "rollout.delta_sync"),
        ("carry", ["trainer.mode=async", "algorithm.adv_estimator=remax"], "algorithm.adv_estimator"),
    ],
)
def test_partial_rollouts_where_they_cannot_run_are_refused_naming_the_key(tmp_path, mode, sets, key):
    """trainer.partial_rollouts is read by the async pipeline's HF rollout workers (swaps on full
    pushes; carried rows without ReMax's regenerated baseline); anywhere else it would sit unread."""
    p = write(tmp_path, GOOD)
    args = ["profile", "check", p, "--set", f'trainer.partial_rollouts="{mode}"']
    for s in sets:
        args += ["--set", s]
    assert_user_error(args, f"{key}: trainer.partial_rollouts = '{mode}'")


@pytest.mark.parametrize(("mode", "backend"), [("swap", "inprocess"), ("swap", "ray"), ("carry", "ray")])
def test_partial_rollouts_in_async_are_accepted(tmp_path, mode, backend):
    p = write(tmp_path, GOOD)
    sets = [f'trainer.partial_rollouts="{mode}"', "trainer.mode=async", f"cluster.backend={backend}"]
    if mode == "carry":
        sets.append("rollout.delta_sync=true")  # pushes between rounds: delta pushes as plain async's
    code, _, err = run_cli("profile", "check", p, *[a for s in sets for a in ("--set", s)])
    assert code == 0, err
