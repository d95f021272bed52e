"""One plan per run on the simulated vendor hosts of the run-plan issue: ``rlctl plan P --json``,
``rlctl doctor --profile P --json`` and the engine construction ``rlctl train P`` performs
(the plan's role specs -> the worker's ``rollout_engine`` -> the fake engine of the installed release,
whose config class rejects any keyword that release lacks) agree on engine, kernel, keywords,
environment and pin verdicts."""

from __future__ import annotations

import json

import pytest

import rlctl.platforms.resolve as resolve
from rlctl.cli.main import main
from rlctl.platforms.resolve import resolve_platform
from rlctl.profile import load_profile
from rlctl.trainer.plan.run_plan import resolve_plan
from rlctl.trainer.workers.rollout_engines import rollout_engine
from tests.engines.fakes import install
from tests.engines.helpers import make_model
from tests.engines.test_vendor_construction import _hardware
from tests.platforms.vendor_hosts import (
    ascend_910b,
    ascend_sglang_only,
    b200_sglang,
    h100,
    mi300x,
    mi355x_aiter,
)

# host -> (the engine auto picks, its release on that host, pins that must FAIL the plan)
HOSTS = {
    "h100-570": (lambda t: h100(t, "570.133.20"), "vllm", "0.33.0", {"torch-cuda-driver"}),
    "h100-580": (lambda t: h100(t, "580.82.07"), "vllm", "0.33.0", set()),
    "b200-sglang": (b200_sglang, "sglang", "0.5.23", set()),
    "mi300x": (mi300x, "vllm", "0.33.0", {"rocm-cuda-visible-devices", "ray-noset-hip-visible-devices"}),
    "910b": (ascend_910b, "vllm", "0.23.0", set()),
    "mi355x-aiter": (mi355x_aiter, "vllm", "0.33.0", set()),
}


def _run(args: list[str], capsys) -> dict:
    with pytest.raises(SystemExit):
        main(args)
    return json.loads(capsys.readouterr().out)


def _profile(tmp_path, vendor: str):
    model = make_model(tmp_path / "model", seed=1, max_position_embeddings=4096)
    path = tmp_path / "p.toml"
    path.write_text(
        f'[model]\npath = "{model}"\n[platform]\nvendor = "{vendor}"\n'
        '[cluster]\ndevices_per_node = 8\n[rollout]\nengine = "auto"\n'
    )
    return path


@pytest.mark.parametrize("name", list(HOSTS))
def test_plan_doctor_and_construction_agree(name, tmp_path, monkeypatch, capsys):
    make_host, engine, version, failing = HOSTS[name]
    host = make_host(tmp_path)
    monkeypatch.delenv("RLCTL_PLATFORM", raising=False)
    monkeypatch.setattr(resolve, "Host", lambda env=None: host)
    vendor = resolve_platform("auto").name
    profile_path = _profile(tmp_path, vendor)

    plan = _run(["plan", str(profile_path), "--json"], capsys)
    doctor = _run(["doctor", "--profile", str(profile_path), "--json"], capsys)
    assert plan["roles"] == doctor["plan"]["roles"] and plan["env"] == doctor["plan"]["env"]
    assert plan["checks"] == doctor["plan"]["checks"]
    rollout = plan["roles"]["rollout"]
    assert rollout["engine"] == engine and plan["host"]["versions"]["rollout"][engine].startswith(version)

    # the pins the plan FAILs are the ones doctor FAILs, and only those
    plan_fails = {c["name"].removeprefix("pin ") for c in plan["checks"] if c["verdict"] == "FAIL"}
    doctor_fails = {
        c["name"].removeprefix("pin:") for c in doctor["checks"] if c["name"].startswith("pin:")
        if c["verdict"] == "FAIL"
    }
    assert failing <= plan_fails and {f for f in plan_fails if "fits" not in f} <= doctor_fails

    # the construction train performs: exactly the plan's keywords reach the engine
    profile = load_profile(profile_path)
    run_plan = resolve_plan(profile)
    policy = run_plan.policy.spec
    assert policy.rollout.engine_kwargs == rollout["engine_kwargs"]
    calls: list = []
    install(monkeypatch, tmp_path, engine, version, calls, **_hardware(run_plan.platform_object))
    rollout_engine(policy)
    got = calls[0][1]
    for key, value in rollout["engine_kwargs"].items():
        assert got[key] == value
    assert "attn_implementation" not in got  # never a transformers kernel name forced on vLLM/SGLang


def test_ascend_with_only_sglang_is_refused_by_plan_and_doctor_alike(tmp_path, monkeypatch, capsys):
    host = ascend_sglang_only(tmp_path)
    monkeypatch.delenv("RLCTL_PLATFORM", raising=False)
    monkeypatch.setattr(resolve, "Host", lambda env=None: host)
    profile_path = _profile(tmp_path, "ascend")
    with pytest.raises(SystemExit) as done:
        main(["plan", str(profile_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert done.value.code == 2 and len(err) == 1 and "rollout.engine" in err[0]
    with pytest.raises(SystemExit) as done:
        main(["train", str(profile_path)])
    train_err = capsys.readouterr().err.strip().splitlines()
    assert done.value.code == 2 and train_err[-1] == err[0]


def _long_context_profile(tmp_path, engine: str, kwargs: str = "") -> str:
    """Llama-3.1-8B (131072 positions) GRPO on 8 GPUs at gpu_memory_utilization 0.3."""
    from rlctl.trainer.plan.shape import KNOWN_CONFIGS

    model = tmp_path / "Llama-3.1-8B-Instruct"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps(KNOWN_CONFIGS["llama-3.1-8b-instruct"]))
    path = tmp_path / f"long-{engine}.toml"
    path.write_text(
        f'[model]\npath = "{model}"\n[platform]\nvendor = "nvidia"\ndtype = "bfloat16"\n'
        f"[cluster]\ndevices_per_node = 8\n[actor]\nactivation_checkpointing = true\n"
        f'[rollout]\nengine = "{engine}"\ngpu_memory_utilization = 0.3\n{kwargs}\n'
    )
    return str(path)


def test_long_context_on_sglang_is_checked_by_sglangs_rule_with_context_length(tmp_path):
    """vLLM refuses to start when one 131072-token sequence's KV exceeds its budget; SGLang only
    warns and serves up to min(context_length, pool) - 1 tokens, and its key is context_length."""
    from tests.cli_runner import run_cli

    checks = lambda out: {c["name"]: c for c in json.loads(out)["checks"]}  # noqa: E731
    code, out, err = run_cli("plan", _long_context_profile(tmp_path, "vllm"), "--hardware", "h100:8", "--json")
    assert checks(out)["max_model_len KV fits"]["verdict"] == "FAIL"
    code, out, err = run_cli("plan", _long_context_profile(tmp_path, "sglang"), "--hardware", "h100:8", "--json")
    sg = checks(out)
    assert "max_model_len KV fits" not in sg and sg["context_length KV fits"]["verdict"] == "PASS"
    code, out, err = run_cli(
        "plan",
        _long_context_profile(tmp_path, "sglang", "engine_kwargs = { context_length = 4096 }"),
        "--hardware",
        "h100:8",
        "--json",
    )
    doc = json.loads(out)
    assert code == 0, err
    assert doc["memory"]["roles"]["rollout"]["max_model_len"] == 4096
    assert doc["memory"]["roles"]["rollout"]["length_key"] == "context_length"
    assert checks(out)["context_length covers prompt + response"]["verdict"] == "PASS"
    # vLLM's key on SGLang is refused in one line, installed or not (ServerArgs has no max_model_len)
    code, out, err = run_cli(
        "plan",
        _long_context_profile(tmp_path, "sglang", "engine_kwargs = { max_model_len = 4096 }"),
        "--hardware",
        "h100:8",
    )
    assert code == 2 and len(err.strip().splitlines()) == 1 and "its length key is 'context_length'" in err


@pytest.mark.parametrize("length, starts", [(4096, True), (16384, False)])
def test_sglang_starts_with_context_length_as_the_plan_says(tmp_path, monkeypatch, capsys, length, starts):
    """On the B200 + SGLang host: the plan's context_length checks and the fake SGLang 0.5.23
    (its _derive_context_length rule) agree, and the engine gets context_length."""
    host = b200_sglang(tmp_path)
    monkeypatch.delenv("RLCTL_PLATFORM", raising=False)
    monkeypatch.delenv("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN", raising=False)
    monkeypatch.setattr(resolve, "Host", lambda env=None: host)
    model = make_model(tmp_path / "model", seed=1, max_position_embeddings=8192)
    path = tmp_path / "p.toml"
    path.write_text(
        f'[model]\npath = "{model}"\n[platform]\nvendor = "nvidia"\n[cluster]\ndevices_per_node = 8\n'
        f'[rollout]\nengine = "sglang"\nengine_kwargs = {{ context_length = {length} }}\n'
    )
    plan = _run(["plan", str(path), "--json"], capsys)
    within = {c["name"]: c["verdict"] for c in plan["checks"]}["context_length within the model"]
    assert within == ("PASS" if starts else "FAIL")
    profile = load_profile(path)
    policy = resolve_plan(profile).policy.spec
    calls: list = []
    install(monkeypatch, tmp_path, "sglang", "0.5.23", calls, device_capability=(10, 0))
    if starts:
        built = rollout_engine(policy)
        assert calls[0][1]["context_length"] == length and built.engine.context_len == length
    else:
        with pytest.raises(ValueError, match="SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"):
            rollout_engine(policy)


# host -> the --hardware target of the same machine
TARGETS = {"h100-580": "h100:8", "b200-sglang": "b200:8", "mi300x": "mi300x:8", "910b": "910b:8"}


@pytest.mark.parametrize("name", list(TARGETS))
def test_plan_for_hardware_x_names_what_a_run_on_x_picks(name, tmp_path, monkeypatch, capsys):
    """``rlctl plan --hardware X`` and the plan on a simulated X host resolve through the same
    platform code: same rollout engine, kernel (and the pick it names), keywords, environment,
    dtype, device arch and device memory. Training kernels agree where the host has no optional
    kernel package (the MI300X host has ROCm flash-attn, which the target does not assume)."""
    make_host, engine, _, _ = HOSTS[name]
    host = make_host(tmp_path)
    monkeypatch.delenv("RLCTL_PLATFORM", raising=False)
    monkeypatch.setattr(resolve, "Host", lambda env=None: host)
    profile_path = _profile(tmp_path, resolve_platform("auto").name)
    profile_path.write_text(profile_path.read_text().replace('engine = "auto"', f'engine = "{engine}"'))
    on_host = _run(["plan", str(profile_path), "--json"], capsys)
    target = _run(["plan", str(profile_path), "--hardware", TARGETS[name], "--json"], capsys)
    for doc in (on_host, target):
        assert doc["roles"]["rollout"]["engine"] == engine
    keys = ("kernel", "engine_kwargs", "env")
    assert {k: target["roles"]["rollout"][k] for k in keys} == {k: on_host["roles"]["rollout"][k] for k in keys}
    assert target["roles"]["rollout"]["settings"]["reason"] == on_host["roles"]["rollout"]["settings"]["reason"]
    assert target["dtype"] == on_host["dtype"] and target["env"] == on_host["env"]
    if name != "mi300x":
        assert target["roles"]["policy"]["kernel"] == on_host["roles"]["policy"]["kernel"]


@pytest.mark.parametrize(
    "hardware, engine, pick",
    [("h100:8", "sglang", "fa3"), ("b200:8", "sglang", "trtllm_mha"), ("b200:8", "vllm", "FLASHINFER")],
)
def test_hardware_targets_name_the_engines_real_pick(tmp_path, hardware, engine, pick):
    from tests.cli_runner import run_cli

    model = make_model(tmp_path / "model", seed=1, max_position_embeddings=4096)
    path = tmp_path / "p.toml"
    path.write_text(f'[model]\npath = "{model}"\n[platform]\nvendor = "nvidia"\n[rollout]\nengine = "{engine}"\n')
    code, out, err = run_cli("plan", str(path), "--hardware", hardware, "--json")
    assert code == 0, err
    assert f"own choice: {pick} " in json.loads(out)["roles"]["rollout"]["settings"]["reason"]


def test_forced_fa3_on_a_b200_target_is_refused(tmp_path):
    """SGLang's fa3 asserts SM 8.x/9.0: the B200 target refuses it as a B200 host does."""
    from tests.cli_runner import run_cli

    model = make_model(tmp_path / "model", seed=1, max_position_embeddings=4096)
    path = tmp_path / "p.toml"
    path.write_text(
        f'[model]\npath = "{model}"\n[platform]\nvendor = "nvidia"\n[rollout]\nengine = "sglang"\n'
        'engine_kwargs = { attention_backend = "fa3" }\n'
    )
    code, out, err = run_cli("plan", str(path), "--hardware", "b200:8")
    assert code == 2 and "fa3" in err and len(err.strip().splitlines()) == 1
    code, out, err = run_cli("plan", str(path), "--hardware", "h100:8")
    assert code == 0, err


def test_mi355x_moe_runs_aiter_attention_without_aiter_moe(tmp_path, monkeypatch, capsys):
    """MI355X with aiter and a MoE model: plan, doctor and the worker env agree on AITER attention
    with VLLM_ROCM_USE_AITER_MOE=0 (vLLM 0.33's AITER MoE shuffles experts after loading), and
    the plan for --hardware mi355x:8 names the same vLLM pick on gfx950."""
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

    host = mi355x_aiter(tmp_path)
    monkeypatch.delenv("RLCTL_PLATFORM", raising=False)
    monkeypatch.setattr(resolve, "Host", lambda env=None: host)
    moe = tmp_path / "moe"
    config = Qwen2MoeConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
        shared_expert_intermediate_size=16, num_experts=4, num_experts_per_tok=2, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
    )  # fmt: skip
    Qwen2MoeForCausalLM(config).save_pretrained(moe)
    path = tmp_path / "p.toml"
    path.write_text(
        f'[model]\npath = "{moe}"\n[platform]\nvendor = "rocm"\n[cluster]\ndevices_per_node = 8\n'
        '[rollout]\nengine = "vllm"\n'
    )
    plan = _run(["plan", str(path), "--json"], capsys)
    doctor = _run(["doctor", "--profile", str(path), "--json"], capsys)
    want = {"VLLM_ROCM_USE_AITER": "1", "VLLM_ROCM_USE_AITER_MOE": "0"}
    for env in (plan["env"], doctor["plan"]["env"], plan["roles"]["rollout"]["env"]):
        assert {k: env.get(k) for k in want} == want
    target = _run(["plan", str(path), "--hardware", "mi355x:8", "--json"], capsys)
    assert target["roles"]["rollout"]["settings"]["reason"] == plan["roles"]["rollout"]["settings"]["reason"]
    assert target["device"]["arch"] == "gfx950"
