"""``rlctl bench reshard`` tells the whole truth: exact checks that catch a misplaced value, the peer
baselines and the trainer's own sync on 4 / 2 gloo ranks, self-describing rows."""

from __future__ import annotations

import pytest
import torch

from rlctl.bench.reshard import MODELS, BenchDevice, bench, layer_costs, peer_ratios, plan_cases
from rlctl.errors import RunError
from rlctl.reshard.layout import fsdp_shard_rows
from rlctl.reshard.model import spec_from_config
from rlctl.reshard.verify import check, digests, expected_digests, fill, full_state, vllm_shard

SMALL = {  # fast shape: GQA (kv 2 < tp 4 would replicate), padded vocab, uneven FSDP rows
    "model_type": "qwen2", "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
    "intermediate_size": 48, "vocab_size": 130, "num_hidden_layers": 2, "tie_word_embeddings": False,
}  # fmt: skip


@pytest.fixture
def small_model(monkeypatch):
    monkeypatch.setitem(MODELS, "small", SMALL)
    return "small"


def test_fill_is_positional_and_shards_agree() -> None:
    full = fill((130, 32), 0, 5, torch.bfloat16)
    assert bool(full.isfinite().all())
    for r in range(3):
        a, b = fsdp_shard_rows(130, 3, r)
        assert torch.equal(fill((b - a, 32), a, 5, torch.bfloat16, full_rows=130), full[a:b])
    assert not torch.equal(fill((130, 32), 0, 6, torch.bfloat16), full)  # another parameter, other values
    assert full.unique().numel() > 1000  # a misplaced element changes the tensor


def test_a_misplaced_value_is_caught_naming_rank_and_tensor() -> None:
    spec = spec_from_config(SMALL, torch.bfloat16)
    full = full_state(spec.hf_params(), spec.dtype)
    want = expected_digests(SMALL, full, 4, 2, "contiguous", "vllm")
    got = [digests(vllm_shard(full, SMALL, r % 2, 2)) for r in range(4)]
    check("exact", got, want)  # the reference passes its own check
    bad = vllm_shard(full, SMALL, 1, 2)
    qkv = bad["model.layers.1.self_attn.qkv_proj.weight"].clone()
    qkv[0, 0], qkv[0, 1] = qkv[0, 1].clone(), qkv[0, 0].clone()  # one value in the wrong place
    bad["model.layers.1.self_attn.qkv_proj.weight"] = qkv
    got[3] = digests(bad)
    with pytest.raises(RunError, match=r"rank 3: model\.layers\.1\.self_attn\.qkv_proj\.weight"):
        check("planned", got, want)
    got[3] = digests({k: v for k, v in bad.items() if k != "model.norm.weight"})
    with pytest.raises(RunError, match="model.norm.weight missing"):
        check("planned", got, want)


@pytest.mark.timeout(120)
def test_bench_fails_loudly_when_a_rank_holds_a_misplaced_value(small_model) -> None:
    with pytest.raises(RunError, match=r"reshard check failed for planned .* rank 0: lm_head\.weight"):
        bench(
            [small_model],
            [(1, 1)],
            repeat=1,
            strategies=("planned",),
            corrupt={"rank": 0, "tensor": "lm_head.weight"},
        )


@pytest.mark.timeout(240)
def test_planned_and_peers_on_four_gloo_ranks_exact_and_described(small_model) -> None:
    rows = bench(
        [small_model],
        [(4, 2)],
        repeat=1,
        bucket_bytes=4096,
        strategies=("planned", "verl", "openrlhf", "trl"),
    )
    assert [r.strategy for r in rows] == ["planned", "verl", "openrlhf", "trl"]
    spec = spec_from_config(SMALL, torch.bfloat16)
    for r in rows:
        assert r.match and (r.p, r.q, r.fmt, r.rank_order) == (4, 2, "vllm", "contiguous")
        assert (r.layers_kept, r.layers_full, r.params, r.model_bytes) == (
            2,
            2,
            spec.num_params(),
            spec.nbytes(),
        )
        assert r.bucket_bytes == 4096 and r.transport and r.loopback_gbps > 0 and r.frac_loopback > 0
    planned, verl, openrlhf, _ = rows
    assert (
        planned.recv_bytes_max < verl.recv_bytes_max < openrlhf.recv_bytes_max
    )  # bytes the busiest rank takes in
    assert set(peer_ratios(rows)[(small_model, 2, 4, 2, "vllm")]) == {"verl", "openrlhf", "trl"}


@pytest.mark.timeout(240)
def test_trainer_row_runs_the_loops_sync_on_real_engines(small_model) -> None:
    rows = bench([small_model], [(2, 1)], repeat=1, strategies=("planned", "trainer"))
    assert [(r.strategy, r.fmt, r.match) for r in rows] == [("planned", "hf", True), ("trainer", "hf", True)]
    assert rows[1].transport == "PolicyWorker.sync_weights"


@pytest.mark.timeout(300)
def test_trainer_row_at_tp2_fills_the_tp_engines_shards_checked_byte_for_byte(small_model) -> None:
    """At q > 1 the loop's sync runs into the HF engine's tensor-parallel shards, in a case of its
    own beside planned and verl into the same layout, every byte checked."""
    rows = bench([small_model], [(2, 2)], repeat=1, strategies=("planned", "verl", "trainer"))
    in_loop = [(r.strategy, r.match) for r in rows if r.fmt == "hf_tp"]
    assert in_loop == [("planned", True), ("verl", True), ("trainer", True)]
    assert {r.fmt for r in rows if r.strategy != "trainer"} == {"vllm", "hf_tp"}
    assert set(peer_ratios(rows)[(small_model, 2, 2, 2, "hf_tp")]) == {"verl", "trainer"}


@pytest.mark.slow  # the check itself is covered by the planned row's corruption test above
@pytest.mark.timeout(300)
def test_a_wrong_value_in_one_tp_shard_fails_the_trainer_row(small_model) -> None:
    """The trainer row's own check: one misplaced value in one TP shard fails it, naming it."""
    with pytest.raises(RunError, match=r"trainer .*hf_tp.* rank 1: model\.layers\.0\.mlp\.down_proj\.weight"):
        bench(
            [small_model], [(2, 2)], repeat=1, strategies=("trainer",),
            corrupt={"rank": 1, "tensor": "model.layers.0.mlp.down_proj.weight", "strategy": "trainer"},
        )  # fmt: skip


def test_layers_kept_fit_memory_and_a_second_depth_gives_the_per_layer_cost() -> None:
    cases = plan_cases(["llama2-7b"], [(1, 1), (4, 2)], ("planned", "verl", "trl"), 1 << 30, BenchDevice())
    main, probe = [c for c in cases if c.p == 4]
    assert main.cfg["num_hidden_layers"] == 1 and main.strategies == ("planned", "verl", "trl")
    assert probe.cfg["num_hidden_layers"] > 1 and probe.strategies == (
        "planned",
        "verl",
    )  # bounded memory only
    from rlctl.bench.reshard import Row

    def row(layers: int, s: float) -> Row:
        return Row(
            "llama2-7b", 0, 4, 2, "planned", s, 0, 0, 0, 1, None, 0, True, layers_kept=layers, layers_full=32
        )

    (cost,) = layer_costs([row(1, 0.5), row(3, 0.9)])
    assert cost.per_layer_s == pytest.approx(0.2) and cost.full_model_s == pytest.approx(0.3 + 0.2 * 32)
