"""The run plan: device catalogue, model shapes, per-device memory and the fit checks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlctl.errors import UserError
from rlctl.platforms.catalogue import CATALOGUE, cpu_spec, parse_hardware
from rlctl.platforms.host import Host
from rlctl.profile import load_profile
from rlctl.trainer.plan import memory as mem
from rlctl.trainer.plan.run_plan import resolve_plan
from rlctl.trainer.plan.shape import KNOWN_CONFIGS, model_shape, shape_from_config

REPO = Path(__file__).resolve().parents[2]
GIB = 1 << 30


def test_hardware_spec_parses_device_and_count():
    spec, n = parse_hardware("MI300X:8")
    assert (spec.name, spec.platform, n) == ("mi300x", "rocm", 8)
    # what rocminfo reports (201310208 KiB), not the datasheet's 192 GB as 10^9 bytes
    assert spec.memory_bytes == pytest.approx(201310208 * 1024, rel=1e-4)
    assert parse_hardware("h100")[1] == 1
    assert set(CATALOGUE) >= {"h100", "h200", "b200", "a100", "mi300x", "mi325x", "910b", "910c"}
    with pytest.raises(UserError, match="unknown device 'tpu'"):
        parse_hardware("tpu:8")
    with pytest.raises(UserError, match="COUNT >= 1"):
        parse_hardware("h100:0")


def test_cpu_spec_reads_this_hosts_meminfo(tmp_path):
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/meminfo").write_text("MemTotal:       16777216 kB\nMemFree: 1 kB\n")
    assert cpu_spec(Host(root=tmp_path)).memory_gib == 16.0


def test_shape_counts_exactly_the_parameters_transformers_builds():
    from transformers import AutoModelForCausalLM

    path = REPO / "profiles/assets/tiny-1m-addition-sft"
    model = AutoModelForCausalLM.from_pretrained(path)
    assert model_shape(str(path)).params == sum(p.numel() for p in model.parameters())
    # Qwen2.5-7B-Instruct's published size is 7.61B parameters (q/k/v biases, untied head)
    assert model_shape("/models/Qwen2.5-7B-Instruct").params == 7_615_616_512


def test_llama_31_8b_kv_at_131072_tokens_is_16_gib():
    """vLLM 0.33 needs cdiv(max_model_len, 16) KV pages per layer for one max-length sequence."""
    shape = shape_from_config(KNOWN_CONFIGS["llama-3.1-8b-instruct"], "test")
    ro = mem.rollout_memory(
        shape,
        engine="vllm",
        dtype="bfloat16",
        tp=1,
        gpu_memory_utilization=0.9,
        device_bytes=80 * 10**9,
        max_model_len=131072,
        rows_per_rank=1,
        seq_len=1024,
    )
    assert ro.kv_per_max_len_sequence == 16 * GIB
    assert ro.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2


def test_unknown_model_without_config_names_the_path():
    with pytest.raises(UserError, match="no config.json here and is not a known model"):
        model_shape("/nowhere/SomeModel-3B")


def _profile(tmp_path: Path, text: str):
    path = tmp_path / "p.toml"
    path.write_text(text)
    return load_profile(str(path))


def _llama_profile(tmp_path: Path, extra: str = "") -> object:
    model = tmp_path / "Llama-3.1-8B-Instruct"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps(KNOWN_CONFIGS["llama-3.1-8b-instruct"]))
    return _profile(
        tmp_path,
        f'[run]\nname = "l"\n[platform]\nvendor = "nvidia"\n[model]\npath = "{model}"\n'
        f'[rollout]\nengine = "vllm"\n{extra}',
    )


def test_vllm_refusing_max_model_len_is_a_fail_with_the_fix(tmp_path):
    plan = resolve_plan(
        _llama_profile(tmp_path, "gpu_memory_utilization = 0.35\n"), hardware=parse_hardware("h100:1")
    )
    failed = {c.name: c for c in plan.failures}
    assert "max_model_len KV fits" in failed
    kv = failed["max_model_len KV fits"]
    assert "131072-token sequence needs 16.00 GiB" in kv.reason
    assert "max_model_len" in kv.fix
    # more memory for the engine: the same model and length fit
    ok = resolve_plan(
        _llama_profile(tmp_path, "gpu_memory_utilization = 0.6\n"), hardware=parse_hardware("h100:1")
    )
    assert "max_model_len KV fits" not in {c.name for c in ok.failures}


def test_qwen7b_on_eight_mi300x_shards_training_state_and_passes():
    profile = load_profile(str(REPO / "profiles/qwen7b-mi300x.toml"))
    plan = resolve_plan(profile, hardware=parse_hardware("mi300x:8"))
    d = plan.to_dict()
    assert d["verdict"] == "PASS", [c.line() for c in plan.failures]
    assert (d["platform"]["name"], d["world_size"], d["dtype"]) == ("rocm", 8, "bfloat16")
    assert d["roles"]["policy"]["engine"] == "fsdp" and d["roles"]["rollout"]["engine"] == "vllm"
    actor = d["memory"]["roles"]["policy"]
    params = plan.model.params
    # fp32 master weights, grads and two AdamW moments, each sharded 8 ways
    assert actor["weights_gib"] == pytest.approx(4 * params / 8 / GIB, abs=1e-3)
    assert actor["optimizer_gib"] == pytest.approx(8 * params / 8 / GIB, abs=1e-3)
    assert actor["activations_checkpointing_gib"] < actor["activations_no_checkpointing_gib"] / 5
    sync = d["memory"]["weight_sync"]
    assert sync["bytes_gib"] == pytest.approx(2 * params / GIB, abs=1e-3)  # bf16 rollout copy
    assert 0 < sync["seconds"] < 1
    assert {c["name"] for c in d["checks"]} >= {
        "attention heads / tensor_parallel",
        "training fits",
        "rollout fits",
        "max_model_len KV fits",
    }


def test_fewer_devices_fail_training_fit(tmp_path):
    """The same 8B model trained on one A100 does not fit (16 bytes per parameter unsharded)."""
    plan = resolve_plan(_llama_profile(tmp_path), hardware=parse_hardware("a100:1"))
    assert "training fits" in {c.name for c in plan.failures}
    eight = resolve_plan(
        _llama_profile(tmp_path, "gpu_memory_utilization = 0.5\n"), hardware=parse_hardware("h200:8")
    )
    assert "training fits" not in {c.name for c in eight.failures}


def test_this_host_plan_names_versions_and_pins(tmp_path):
    plan = resolve_plan(load_profile(str(REPO / "profiles/tiny-cpu.toml")))
    actor, rollout = plan.roles["policy"], plan.roles["rollout"]
    assert (plan.platform, plan.device_type, plan.dist_backend) == ("cpu", "cpu", "gloo")
    assert actor.versions["torch"] and actor.versions["transformers"]
    assert rollout.engine == "hf" and rollout.kernel == actor.kernel
    assert any(p.details["id"] == "transformers-5.6.0" for p in actor.pins)
    assert plan.memory["cpu_worker_baseline_gib"] == mem.CPU_WORKER_BASELINE_GIB
    json.dumps(plan.to_dict())  # JSON-able


def test_workers_are_built_from_the_plan_not_resolved_again(monkeypatch, tmp_path):
    """Each role's spec is resolved with the plan and carried by it: the policy's kernel and the
    rollout engine's keywords are the plan's, and ``build_context`` hands every worker exactly
    the spec object its role plan holds (the one ``plan.json`` writes), nothing re-resolved."""
    from rlctl.trainer.setup import context

    profile = load_profile(str(REPO / "profiles/tiny-cpu.toml"))
    plan = resolve_plan(profile)
    policy = plan.policy.spec
    assert policy.engine.attn_implementation == plan.policy.kernel
    assert policy.rollout is plan.roles["rollout"].spec
    assert policy.rollout.engine_kwargs == plan.roles["rollout"].settings.engine_kwargs
    assert plan.to_dict()["roles"]["policy"]["spec"]["engine"]["attn_implementation"] == plan.policy.kernel
    handed: dict = {}

    def spawn(pool, roles, **kw):
        handed.update(kw["init_kwargs"])
        raise RuntimeError("stop before any worker starts")

    monkeypatch.setattr(context, "spawn_colocated", spawn)
    with pytest.raises(RuntimeError, match="stop before"):
        context.build_context(profile, tmp_path, plan)
    assert set(handed) == {"policy"} and handed["policy"]["spec"] is policy


def test_pins_of_packages_the_run_uses_fail_the_plan(tmp_path):
    """The trainer preflight: a fail-severity pin violated on a package a role runs FAILs the plan
    (train refuses it); one on a package the run does not use is a WARN line."""
    from rlctl.platforms.cpu import CpuPlatform
    from rlctl.trainer.plan.run_plan import refuse_failures
    from tests.platforms.fakes import make_dist, make_torch

    site = tmp_path / "site"
    make_torch(site, "2.13.0+cpu")
    make_dist(site, "transformers", "5.6.0")  # pins.toml transformers-5.6.0: != 5.6.0, severity fail
    make_dist(site, "vllm", "0.9.0")  # vllm-min violated, but this run's rollout engine is hf
    make_dist(site, "ray", "2.60.0")
    platform = CpuPlatform(Host(env={}, path=[str(site)]))
    plan = resolve_plan(load_profile(str(REPO / "profiles/tiny-cpu.toml")), platform=platform)
    lines = {c.name: c for c in plan.checks if c.name.startswith("pin ")}
    assert lines["pin transformers-5.6.0"].verdict == "FAIL"
    assert "5.7" in lines["pin transformers-5.6.0"].fix
    assert "pin vllm-min" not in lines  # evaluate_pins: n/a for a run whose rollout engine is hf
    assert plan.roles["policy"].versions["transformers"] == "5.6.0"
    with pytest.raises(UserError, match="pin transformers-5.6.0"):
        refuse_failures(plan)


def test_lora_plan_counts_adapter_state_and_adapter_sync():
    """[actor.lora]: gradients and AdamW state for the adapter alone, no reference copy, and the
    HF engine's adapter-only sync (peft's own parameter count for the same adapter)."""
    full = resolve_plan(load_profile(str(REPO / "profiles/smollm2-cpu.toml")), hardware=None)
    lora = resolve_plan(load_profile(str(REPO / "profiles/smollm2-lora-cpu.toml")), hardware=None)
    trainable = lora.memory["lora_trainable_params"]
    # SmolLM2-135M, all-linear at rank r: r x (in + out) summed over 7 projections x 30 layers
    r = load_profile(str(REPO / "profiles/smollm2-lora-cpu.toml")).actor.lora.rank
    per_layer = (576 + 576) + 2 * (576 + 192) + (576 + 576) + 2 * (576 + 1536) + (1536 + 576)
    assert trainable == r * per_layer * 30
    actor, actor_full = lora.memory["roles"]["policy"], full.memory["roles"]["policy"]
    assert actor["grads_gib"] < actor_full["grads_gib"] / 20
    assert actor["optimizer_gib"] < actor_full["optimizer_gib"] / 20
    assert "ref" not in lora.roles
    assert lora.memory["weight_sync"]["lora"] == "adapter-only"
    assert lora.memory["weight_sync"]["bytes_gib"] <= 0.05 * full.memory["weight_sync"]["bytes_gib"]
    assert lora.memory["predicted_peak_gib"] < full.memory["predicted_peak_gib"]


def test_the_logits_term_is_what_engines_logprob_keeps():
    """Two compute-dtype copies of the kept positions' logits (the logits and their gradient) plus
    one chunk's fp32 temporaries, with the chunk engines.logprob really uses."""
    from rlctl.engines.logprob import CHUNK_ELEMENTS
    from rlctl.trainer.plan.memory import LOGPROB_CHUNK_ELEMENTS, logits_bytes

    assert LOGPROB_CHUNK_ELEMENTS == CHUNK_ELEMENTS
    vocab = 152064
    chunk_tokens = CHUNK_ELEMENTS // vocab
    assert logits_bytes(20, 1024, vocab, 2) == 2 * 20 * 1025 * vocab * 2 + 4 * chunk_tokens * vocab * 4
    assert logits_bytes(1, 1, 104, 4) == 2 * 2 * 104 * 4 + 4 * 2 * 104 * 4  # a chunk never exceeds the tokens
