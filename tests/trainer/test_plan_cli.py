"""`rlctl plan`, `rlctl doctor --profile` and `rlctl train` share one plan; train refuses a FAIL."""

from __future__ import annotations

import json
from pathlib import Path

from rlctl.trainer.plan.shape import KNOWN_CONFIGS
from tests.cli_runner import run_cli

REPO = Path(__file__).resolve().parents[2]


def test_plan_for_a_target_cluster_prints_memory_and_checks():
    code, out, err = run_cli("plan", str(REPO / "profiles/qwen7b-mi300x.toml"), "--hardware", "mi300x:8")
    assert code == 0, err
    assert "8 mi300x" in out and "engine vllm" in out
    assert "memory per device" in out and "activations at" in out and "KV budget" in out
    assert "PASS max_model_len KV fits" in out
    assert out.rstrip().endswith("verdict: PASS (0 failing check(s))")


def test_plan_json_and_bad_hardware():
    code, out, err = run_cli(
        "plan", str(REPO / "profiles/qwen7b-mi300x.toml"), "--hardware", "h100:8", "--json"
    )
    assert code == 0, err
    doc = json.loads(out)
    assert doc["device"]["name"] == "h100" and doc["platform"]["name"] == "nvidia"
    assert doc["memory"]["roles"]["rollout"]["engine"] == "vllm"
    code, out, err = run_cli("plan", str(REPO / "profiles/qwen7b-mi300x.toml"), "--hardware", "tpu:8")
    assert code == 2 and "unknown device 'tpu'" in err and len(err.strip().splitlines()) == 1
    # on this CPU host the ROCm profile's platform is not usable: one line pointing to --hardware
    code, out, err = run_cli("plan", str(REPO / "profiles/qwen7b-mi300x.toml"))
    assert code == 2 and "rocm is not usable here" in err and "--hardware DEVICE:N" in err


def _oversized_cpu_profile(tmp_path: Path) -> Path:
    model = tmp_path / "Llama-3.1-8B-Instruct"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(KNOWN_CONFIGS["llama-3.1-8b-instruct"]))
    path = tmp_path / "big.toml"
    path.write_text(
        f'[run]\nname = "big"\noutput_dir = "{tmp_path / "runs"}"\n[platform]\nvendor = "cpu"\n'
        f'[cluster]\nbackend = "inprocess"\n[model]\npath = "{model}"\n[rollout]\nengine = "hf"\n'
    )
    return path


def test_train_refuses_a_failing_plan_before_any_worker(tmp_path):
    """An 8B model trained in fp32 with AdamW on this host's RAM: 16 bytes a parameter do not fit."""
    profile = _oversized_cpu_profile(tmp_path)
    code, out, err = run_cli("plan", str(profile))
    assert code == 1 and "FAIL training fits" in out
    code, out, err = run_cli("train", str(profile))
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "FAIL check" in lines[0] and "training fits" in lines[0] and "fix:" in lines[0]
    assert not (tmp_path / "runs/big").exists()  # refused before the run directory, data or workers


def test_doctor_profile_shows_the_plan_train_builds(tmp_path):
    profile = str(REPO / "profiles/tiny-cpu.toml")
    code, out, err = run_cli("plan", profile, "--json")
    assert code == 0, err
    plan = json.loads(out)
    code, out, err = run_cli("doctor", "--profile", profile, "--json")
    doc = json.loads(out)
    assert doc["plan"] is not None, err
    for role in ("policy", "rollout"):
        for key in ("engine", "kernel", "engine_kwargs", "env", "spec"):
            assert doc["plan"]["roles"][role][key] == plan["roles"][role][key], (role, key)
    assert doc["plan"]["host"] == plan["host"]  # the versions and pins it read
    assert doc["plan"]["memory"] == plan["memory"]
    names = {c["name"] for c in doc["checks"]}
    assert "plan:training fits" in names and "plan:max_model_len covers prompt + response" in names


def test_doctor_profile_reports_a_failing_plan(tmp_path):
    code, out, err = run_cli("doctor", "--profile", str(_oversized_cpu_profile(tmp_path)), "--json")
    doc = json.loads(out)
    fails = [c for c in doc["checks"] if c["verdict"] == "FAIL" and c["name"].startswith("plan:")]
    assert code == 1 and "plan:training fits" in [c["name"] for c in fails]


def test_simulated_h200_host_doctor_and_plan_agree(tmp_path, monkeypatch, capsys):
    """An 8x H200 host (fake sysfs, recorded NVML answers, vLLM installed): the plan reads the
    device and its memory from the probe, and doctor --profile shows the same plan."""
    import pytest

    import rlctl.platforms.resolve as resolve
    from rlctl.cli.main import main
    from tests.platforms.fakes import make_dist, nvidia_host

    host = nvidia_host(tmp_path)
    make_dist(tmp_path / "site", "vllm", "0.11.0", requires=("torch==2.7.1",))
    monkeypatch.delenv("RLCTL_PLATFORM", raising=False)
    monkeypatch.setattr(resolve, "Host", lambda env=None: host)
    docs = {}
    for args in (
        ["plan", str(REPO / "profiles/qwen7b-h100.toml"), "--json"],
        ["doctor", "--profile", str(REPO / "profiles/qwen7b-h100.toml"), "--json"],
    ):
        with pytest.raises(SystemExit):
            main(args)
        docs[args[0]] = json.loads(capsys.readouterr().out)
    plan, doctor = docs["plan"], docs["doctor"]["plan"]
    assert plan["device"]["name"] == "h200" and plan["device"]["memory_gib"] == 140.4  # NVML's total
    assert plan["host"]["versions"]["rollout"]["vllm"] == "0.11.0"
    assert plan["roles"] == doctor["roles"] and plan["checks"] == doctor["checks"]
    assert plan["memory"] == doctor["memory"]


def test_h100_qwen7b_at_20_sequences_a_micro_batch_is_not_refused():
    """Qwen2.5-7B on 8 x H100 at micro_batch_sequences = 20 fits (~26 GiB training peak): the
    logits term is the compute-dtype logits and their gradient (engines.logprob), not five fp32
    copies, and the device is the 81559 MiB nvidia-smi reports, not 80 x 10^9 bytes."""
    code, out, err = run_cli(
        "plan",
        str(REPO / "profiles/qwen7b-h100.toml"),
        "--hardware",
        "h100:8",
        "--set",
        "actor.micro_batch_sequences=20",
        "--json",
    )
    assert code == 0, err
    doc = json.loads(out)
    assert doc["device"]["memory_gib"] == 79.65
    actor = doc["memory"]["roles"]["policy"]
    assert 11.0 < actor["logits_gib"] < 12.5  # 2 x 20 x 1025 x 152064 x 2 bytes + the chunks
    assert [c for c in doc["checks"] if c["name"] == "training fits"][0]["verdict"] == "PASS"


def test_training_fits_fix_does_not_suggest_checkpointing_that_is_on():
    """One H100 at 20 sequences a micro-batch does not fit; the profile already checkpoints."""
    code, out, err = run_cli(
        "plan",
        str(REPO / "profiles/qwen7b-h100.toml"),
        "--hardware",
        "h100:1",
        "--set",
        "actor.micro_batch_sequences=20",
        "--set",
        "cluster.devices_per_node=1",
        "--json",
    )
    fits = [c for c in json.loads(out)["checks"] if c["name"] == "training fits"][0]
    assert fits["verdict"] == "FAIL" and "activation_checkpointing" not in fits["fix"]
    assert "micro_batch_sequences" in fits["fix"]
