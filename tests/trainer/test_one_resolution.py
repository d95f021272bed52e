"""One resolved run: ``rlctl train`` and ``rlctl plan --hardware`` resolve through one code path
(the run's ``plan.json`` and the target's plan agree byte for byte outside the ``host`` section),
and a ``--resume PATH`` is read once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import rlctl.platforms.resolve as resolve
from rlctl.platforms.resolve import resolve_platform
from rlctl.trainer.state import checkpoint as ck
from tests.cli_runner import run_cli
from tests.trainer.test_plan_vendor_hosts import HOSTS, TARGETS, _profile, _run


def resolved(doc: dict) -> str:
    """The resolved sections of a plan document as ``plan.json`` writes them (the ``host``
    section holds what only a real host knows: its label, installed versions and pin verdicts)."""
    return json.dumps({k: v for k, v in doc.items() if k != "host"}, indent=2, default=str)


def test_run_plan_json_and_plan_for_this_host_type_are_byte_identical(write_profile, tmp_path):
    """Before one code path the ``--hardware cpu`` target picked eager attention where this host
    picks SDPA (its torch version read as unknown meant "no torch"), so the plans differed."""
    profile = write_profile("same", steps=1)
    code, _, err = run_cli("train", str(profile))
    assert code == 0, err
    written = json.loads((tmp_path / "runs/same/plan.json").read_text())
    code, out, err = run_cli("plan", str(profile), "--hardware", "cpu:1", "--json")
    assert code == 0, err
    target = json.loads(out)
    assert written["host"]["target"] == "this host" and target["host"]["target"] == "cpu:1"
    assert resolved(written) == resolved(target)
    # and the spec each worker was built from is in it
    assert written["roles"]["policy"]["spec"]["engine"]["attn_implementation"] == "sdpa"


def test_a_resume_path_is_read_once(write_profile, tmp_path, monkeypatch):
    profile = write_profile("once", steps=1)
    code, _, err = run_cli("train", str(profile))
    assert code == 0, err
    point = ck.list_checkpoints(tmp_path / "runs/once")[-1].path
    asked: list[str] = []
    real = ck.find_resume_point

    def counted(run_dir: Path, resume: str):
        asked.append(resume)
        return real(run_dir, resume)

    monkeypatch.setattr(ck, "find_resume_point", counted)
    code, _, err = run_cli("train", str(profile), "--resume", str(point))
    assert code == 0, err
    assert asked == [str(point)]  # the run's one resolution, handed down to the loop


@pytest.mark.parametrize("name", ["h100-580", "b200-sglang", "910b"])
def test_a_vendor_host_and_its_hardware_target_resolve_the_same(name, tmp_path, monkeypatch, capsys):
    """On a simulated vendor host with no optional kernel package, no violated pin and no vendor
    variable of the user's, ``rlctl plan`` there and ``rlctl plan --hardware`` for its kind agree
    byte for byte outside ``host`` (engine, kernels, keywords, env, specs, memory, checks)."""
    make_host, engine, _, _ = HOSTS[name]
    host = make_host(tmp_path)
    monkeypatch.delenv("RLCTL_PLATFORM", raising=False)
    monkeypatch.setattr(resolve, "Host", lambda env=None: host)
    profile = _profile(tmp_path, resolve_platform("auto").name)
    profile.write_text(profile.read_text().replace('engine = "auto"', f'engine = "{engine}"'))
    on_host = _run(["plan", str(profile), "--json"], capsys)
    target = _run(["plan", str(profile), "--hardware", TARGETS[name], "--json"], capsys)
    assert resolved(on_host) == resolved(target)
