"""The plan of a tensor-parallel rollout: per-rank rollout weights, sync bytes, TP group order."""

from __future__ import annotations

import json

import pytest

from rlctl.platforms.catalogue import parse_hardware
from rlctl.reshard import choose_rank_order, train_to_rollout_plan
from rlctl.trainer.plan.run_plan import resolve_plan
from rlctl.trainer.plan.shape import KNOWN_CONFIGS
from tests.trainer.test_run_plan import _profile


def _qwen72b(tmp_path, tp: int, devices: int = 8):
    model = tmp_path / "Qwen2.5-72B-Instruct"  # the known config, found by the directory's name
    return _profile(
        tmp_path,
        f'[run]\nname = "q"\n[platform]\nvendor = "nvidia"\ndtype = "bfloat16"\n[model]\npath = "{model}"\n'
        f"[cluster]\ndevices_per_node = {devices}\n"
        f'[rollout]\nengine = "hf"\ntensor_parallel = {tp}\n',
    )


@pytest.mark.parametrize("tp", [4, 8])
def test_72b_on_eight_h100_plans_a_tp_rollout_per_rank(tmp_path, tp):
    plan = resolve_plan(_qwen72b(tmp_path, tp), hardware=parse_hardware("h100:8"))
    d = plan.to_dict()
    checks = {c["name"]: c for c in d["checks"]}
    assert checks["rollout engine / tensor_parallel"]["verdict"] == "PASS"
    assert checks["attention heads / tensor_parallel"]["verdict"] == "PASS"
    # each rank stores 1/tp of the bf16 weights, and the sync moves only that piece into it
    per_rank = plan.model.params * 2 / tp / 2**30
    assert d["memory"]["roles"]["rollout"]["weights_gib"] == pytest.approx(per_rank, rel=1e-3)
    assert d["memory"]["weight_sync"]["bytes_gib"] == pytest.approx(per_rank, rel=1e-3)
    assert "tensor-parallel" in d["memory"]["weight_sync"]["path"]


def test_rank_order_follows_the_bytes_and_stays_inside_a_node():
    cfg = KNOWN_CONFIGS["qwen2.5-7b-instruct"]
    order, why = choose_rank_order(cfg, 8, 2, 8)
    moved = {
        o: train_to_rollout_plan(cfg, 8, 2, rank_order=o, fmt="hf_tp").bytes_moved()
        for o in ("contiguous", "strided")
    }
    assert moved["strided"] < moved["contiguous"] and order == "strided" and why.startswith("strided")
    # 16 ranks over two nodes: strided TP groups would cross the node boundary
    assert choose_rank_order(cfg, 16, 2, 8)[0] == "contiguous"
    assert choose_rank_order(cfg, 4, 4, 4)[0] == "contiguous"  # one replica: both orders the same


def test_an_impossible_tp_is_refused_naming_the_key_and_the_divisor(tmp_path):
    from tests.cli_runner import run_cli

    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(KNOWN_CONFIGS["smollm2-135m-instruct"]))
    path = tmp_path / "p.toml"
    path.write_text(
        f'[model]\npath = "{model}"\n[cluster]\ndevices_per_node = 2\n[rollout]\ntensor_parallel = 2\n'
    )
    code, _, err = run_cli("plan", str(path))
    assert code == 2 and "Traceback" not in err
    assert "rollout.tensor_parallel: 2 does not divide the model's num_attention_heads (9)" in err


def _vllm_profile(tmp_path, model, tp: int, devices: int = 8, engine: str = "vllm"):
    return _profile(
        tmp_path,
        f'[run]\nname = "q"\n[platform]\nvendor = "nvidia"\ndtype = "bfloat16"\n[model]\npath = "{model}"\n'
        f"[cluster]\ndevices_per_node = {devices}\n"
        f'[rollout]\nengine = "{engine}"\ntensor_parallel = {tp}\n',
    )


def _layout_bytes(config, tp: int) -> int:
    """Rank 0's rollout bytes in bf16 as the planner's ``vllm`` layout lays them out."""
    from rlctl.reshard.layout import rollout_layout
    from rlctl.reshard.model import spec_from_config

    return sum(t.numel for t in rollout_layout(spec_from_config(config), tp, fmt="vllm").ranks[0]) * 2


@pytest.mark.parametrize("tp", [4, 8])
def test_72b_on_eight_h100_plans_a_vllm_tp_rollout_per_rank(tmp_path, tp):
    plan = resolve_plan(_vllm_profile(tmp_path, tmp_path / "Qwen2.5-72B-Instruct", tp), hardware=parse_hardware("h100:8"))
    d = plan.to_dict()
    checks = {c["name"]: c for c in d["checks"]}
    assert checks["rollout engine / tensor_parallel"]["verdict"] == "PASS", checks["rollout engine / tensor_parallel"]
    assert "TP groups contiguous" in checks["rollout engine / tensor_parallel"]["detail"]
    want = _layout_bytes(KNOWN_CONFIGS["qwen2.5-72b-instruct"], tp) / 2**30
    assert d["memory"]["roles"]["rollout"]["weights_gib"] == pytest.approx(want, abs=6e-4)


def test_vllm_plan_replicates_kv_heads_where_tp_exceeds_them(tmp_path):
    cfg = {**KNOWN_CONFIGS["qwen2.5-7b-instruct"], "num_attention_heads": 16, "num_key_value_heads": 2,
           "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 4}  # fmt: skip
    model = tmp_path / "kv2"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(cfg))
    plan = resolve_plan(_vllm_profile(tmp_path, model, 4, devices=4), hardware=parse_hardware("h100:4"))
    d = plan.to_dict()
    checks = {c["name"]: c for c in d["checks"]}
    assert checks["attention heads / tensor_parallel"]["verdict"] == "PASS"
    assert "each KV head on 2 ranks" in checks["rollout engine / tensor_parallel"]["detail"]
    # K and V cache per token: one (replicated) KV head per rank, not 2 / 4
    assert d["memory"]["roles"]["rollout"]["weights_gib"] == pytest.approx(_layout_bytes(cfg, 4) / 2**30, abs=6e-4)
    # the HF engine cannot hold half a KV head: the same TP is refused there
    from rlctl.errors import UserError

    with pytest.raises(UserError, match=r"rollout\.tensor_parallel: 4 does not divide the model's num_key_value_heads \(2\)"):
        _vllm_profile(tmp_path, model, 4, devices=4, engine="hf")


def test_sglang_tp_plans_shards_per_rank_and_full_tensors_per_sync(tmp_path):
    plan = resolve_plan(
        _vllm_profile(tmp_path, tmp_path / "Qwen2.5-72B-Instruct", 8, engine="sglang"), hardware=parse_hardware("h100:8")
    )
    d = plan.to_dict()
    checks = {c["name"]: c for c in d["checks"]}
    assert checks["rollout engine / tensor_parallel"]["verdict"] == "PASS"
    want = _layout_bytes(KNOWN_CONFIGS["qwen2.5-72b-instruct"], 8) / 2**30  # SGLang's loaders: vLLM's arithmetic
    assert d["memory"]["roles"]["rollout"]["weights_gib"] == pytest.approx(want, abs=6e-4)
    # every TP rank is fed the full tensors (its scheduler's loaders cut them): the whole model per sync
    assert d["memory"]["weight_sync"]["bytes_gib"] == pytest.approx(plan.model.params * 2 / 2**30, rel=1e-3)
    assert "all-gather" in d["memory"]["weight_sync"]["path"]


def test_vllm_plan_checks_the_mlp_width_as_vllm_divides_it(tmp_path):
    cfg = {**KNOWN_CONFIGS["qwen2.5-7b-instruct"], "num_attention_heads": 16, "num_key_value_heads": 4,
           "hidden_size": 2048, "intermediate_size": 8190, "num_hidden_layers": 4}  # fmt: skip
    model = tmp_path / "odd-mlp"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(cfg))
    plan = resolve_plan(_vllm_profile(tmp_path, model, 4, devices=4), hardware=parse_hardware("h100:4"))
    check = {c["name"]: c for c in plan.to_dict()["checks"]}["attention heads / tensor_parallel"]
    assert check["verdict"] == "FAIL"
    assert "4 does not divide the model's intermediate_size (8190)" in check["detail"]
