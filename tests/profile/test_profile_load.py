"""Profile loading: defaults, extends, presets, overrides, path resolution, round trip."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from rlctl.profile import load_profile, profile_to_toml
from rlctl.profile.loader import available_presets
from tests.cli_runner import run_cli

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]


def test_every_shipped_profile_is_valid():
    profiles = sorted((REPO / "profiles").glob("*.toml"))
    assert profiles
    code, out, err = run_cli("profile", "check", *map(str, profiles))
    assert code == 0, err


def test_show_applies_override():
    code, out, err = run_cli(
        "profile", "show", str(REPO / "profiles/tiny-cpu.toml"), "--set", "actor.lr=2e-6"
    )
    assert code == 0, err
    assert tomllib.loads(out)["actor"]["lr"] == 2e-6


def test_extends_layers_and_resolves_paths_per_file(tmp_path):
    (tmp_path / "base").mkdir()
    (tmp_path / "base/base.toml").write_text(
        '[model]\npath = "models/m"\n[actor]\nlr = 1e-4\n[rollout]\nn = 4\n'
    )
    (tmp_path / "child.toml").write_text('extends = "base/base.toml"\n[actor]\nlr = 5e-5\n')
    prof = load_profile(tmp_path / "child.toml")
    assert prof.actor.lr == 5e-5
    assert prof.rollout.n == 4
    assert prof.model.path == str((tmp_path / "base/models/m").resolve())


def test_preset_is_beneath_the_profile(tmp_path):
    (tmp_path / "p.toml").write_text(
        '[model]\npath="m"\n[algorithm]\npreset="dapo"\n[actor]\nclip_ratio_high=0.3\n'
    )
    prof = load_profile(tmp_path / "p.toml")
    assert prof.algorithm.dynamic_sampling is True
    assert prof.actor.clip_ratio_high == 0.3


@pytest.mark.parametrize("preset", available_presets())
def test_every_preset_loads(tmp_path, preset):
    (tmp_path / "p.toml").write_text(f'[model]\npath="m"\n[algorithm]\npreset="{preset}"\n')
    prof = load_profile(tmp_path / "p.toml")
    assert prof.algorithm.preset == preset


def test_presets_cover_the_documented_algorithms():
    assert {"grpo", "dr_grpo", "dapo", "ppo", "rloo", "reinforce_plus_plus", "remax"} <= set(
        available_presets()
    )


def test_ppo_preset_needs_critic_and_reference(tmp_path):
    (tmp_path / "p.toml").write_text('[model]\npath="m"\n[algorithm]\npreset="ppo"\n')
    prof = load_profile(tmp_path / "p.toml")
    assert prof.uses_critic and prof.uses_reference


def test_show_output_round_trips(tmp_path):
    prof = load_profile(REPO / "profiles/tiny-cpu.toml", ["rollout.n=4"])
    (tmp_path / "again.toml").write_text(profile_to_toml(prof))
    again = load_profile(tmp_path / "again.toml")
    assert profile_to_toml(again) == profile_to_toml(prof)


def test_set_bare_word_is_string(tmp_path):
    (tmp_path / "p.toml").write_text('[model]\npath="m"\n')
    prof = load_profile(tmp_path / "p.toml", ["run.name=my-run", "trainer.loggers=['jsonl']"])
    assert prof.run.name == "my-run"
    assert prof.trainer.loggers == ["jsonl"]


def test_keys_lists_every_section():
    code, out, _ = run_cli("profile", "keys")
    assert code == 0
    for section in (
        "run.",
        "platform.",
        "cluster.",
        "model.",
        "data.",
        "algorithm.",
        "actor.",
        "rollout.",
        "ref.",
        "critic.",
        "reward.",
        "trainer.",
    ):
        assert section in out


def test_profile_reference_doc_is_current():
    from rlctl.profile.reference import reference_markdown

    assert (REPO / "docs/profiles.md").read_text() == reference_markdown(), (
        "regenerate: python -c 'from rlctl.profile.reference import reference_markdown as r; "
        'open("docs/profiles.md", "w").write(r())\''
    )
