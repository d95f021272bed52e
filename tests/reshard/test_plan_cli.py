"""Planner edge cases and the ``rlctl bench reshard`` command end to end (tiny model, one rank)."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from rlctl.errors import UserError
from rlctl.reshard.api import train_to_rollout_plan, world_for
from rlctl.reshard.layout import fsdp_layout, rollout_layout
from rlctl.reshard.model import spec_from_config
from rlctl.reshard.plan import make_plan

CFG = {
    "model_type": "llama", "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
    "intermediate_size": 64, "vocab_size": 200, "num_hidden_layers": 2, "tie_word_embeddings": False,
}  # fmt: skip


def test_single_rank_plan_is_all_local() -> None:
    plan = train_to_rollout_plan(CFG, 1, 1, bucket_bytes=1 << 20)
    assert plan.bytes_moved() == 0 and not any(plan.comm_rounds)
    padding_rows = 2 * (256 - 200)  # embed_tokens and lm_head padded 200 -> 256 rows, zero-filled, not copied
    assert plan.bytes_local() == (sum(lt.numel for lt in plan.dst.ranks[0]) - padding_rows * 32) * 2


def test_strided_ranks_move_fewer_bytes_than_contiguous() -> None:
    spec = spec_from_config(CFG, torch.bfloat16)
    strided = train_to_rollout_plan(spec, 4, 2, bucket_bytes=1 << 20, rank_order="strided")
    contiguous = train_to_rollout_plan(spec, 4, 2, bucket_bytes=1 << 20, rank_order="contiguous")
    assert strided.bytes_moved() < contiguous.bytes_moved()
    # two replicas of every element are needed and one exists: at least the model minus what is local
    assert strided.bytes_moved() >= spec.nbytes() - strided.bytes_local() // 2


def test_bucket_smaller_than_a_row_is_a_user_error() -> None:
    spec = spec_from_config(CFG, torch.float32)
    with pytest.raises(UserError, match="smaller than one row"):
        make_plan(fsdp_layout(spec, 2), rollout_layout(spec, 2), 4, 16)


def test_world_rules() -> None:
    assert world_for(4, 2) == 4 and world_for(2, 4) == 4
    with pytest.raises(UserError, match="not a multiple"):
        world_for(3, 2)


@pytest.mark.timeout(240)
def test_bench_reshard_json_single_rank() -> None:
    """One rank, TP 1 (HF names, what the loop syncs to): every strategy's rows, self-describing."""
    from rlctl.cli.bench_reshard import command

    args = [
        "--json",
        "--models",
        "tiny",
        "--pairs",
        "1:1",
        "--repeat",
        "1",
        "--strategies",
        "planned,trl,disk",
    ]
    result = CliRunner().invoke(command, args)
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert [r["strategy"] for r in rows] == ["planned", "trl", "disk"]
    spec = spec_from_config(__import__("rlctl.bench.reshard", fromlist=["MODELS"]).MODELS["tiny"])
    for r in rows:
        assert r["match"] is True and r["verified"].startswith("sha256")
        assert (r["fmt"], r["layers_kept"], r["layers_full"], r["params"]) == ("hf", 4, 4, spec.num_params())
        assert r["bytes_out"] == r["model_bytes"] == spec.nbytes()  # HF layout: no vocab padding
        assert r["seconds"] > 0 and r["memcpy_gbps"] > 0 and r["frac_memcpy"] > 0
        assert r["loopback_gbps"] is None and r["transport"] == "local copies"
    assert rows[2]["bytes_moved"] > 0 and rows[0]["bytes_moved"] == 0


def test_single_rank_fills_given_buffers_in_place() -> None:
    from rlctl.errors import RunError
    from rlctl.reshard.api import reshard_train_to_rollout
    from tests.reshard.strategies import full_state
    from tests.reshard.vllm_reference import vllm_shard

    spec = spec_from_config(CFG, torch.bfloat16)
    full = full_state(spec, 1)
    plan = train_to_rollout_plan(spec, 1, 1, bucket_bytes=1 << 20)
    out = {lt.name: torch.full(lt.shape, 7.0, dtype=spec.dtype) for lt in plan.dst.ranks[0]}
    stats: dict[str, int] = {}
    got = {}
    for items in reshard_train_to_rollout(
        CFG, train_world=1, rank=0, rollout_tp=1, local_shards=full, out=out, stats=stats
    ):
        got.update(items)
    ref = vllm_shard(full, CFG, 0, 1)
    for name, t in ref.items():
        assert got[name] is out[name] and torch.equal(t, out[name])  # padding rows re-zeroed too
    assert stats["peak_extra_bytes"] == 0  # nothing allocated beyond the caller's buffers
    bad = dict(out)
    bad["model.norm.weight"] = torch.zeros(3, dtype=spec.dtype)
    with pytest.raises(RunError, match="model.norm.weight"):
        list(reshard_train_to_rollout(CFG, train_world=1, rank=0, rollout_tp=1, local_shards=full, out=bad))
