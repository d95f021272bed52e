"""ModelSpec against real transformers models; layout rules on concrete examples and errors."""

from __future__ import annotations

import pytest
import torch

from rlctl.errors import UserError
from rlctl.reshard.layout import check_tp, fsdp_layout, fsdp_shard_rows, rollout_layout, tp_rank_of
from rlctl.reshard.model import spec_from_config


@pytest.mark.parametrize(
    ("cls_name", "extra"),
    [
        ("LlamaForCausalLM", {"attention_bias": True, "mlp_bias": True, "tie_word_embeddings": False}),
        ("LlamaForCausalLM", {"head_dim": 6, "tie_word_embeddings": True}),
        ("Qwen2ForCausalLM", {"tie_word_embeddings": True}),
        ("Qwen2ForCausalLM", {"tie_word_embeddings": False}),
    ],
)
def test_spec_matches_transformers_parameters(cls_name: str, extra: dict) -> None:
    transformers = pytest.importorskip("transformers")
    cfg_cls = transformers.Qwen2Config if cls_name.startswith("Qwen2") else transformers.LlamaConfig
    config = cfg_cls(
        hidden_size=16, num_attention_heads=4, num_key_value_heads=2, intermediate_size=24, vocab_size=50,
        num_hidden_layers=2, **extra,
    )  # fmt: skip
    model = getattr(transformers, cls_name)(config)
    expected = {n: tuple(p.shape) for n, p in model.named_parameters()}
    if config.tie_word_embeddings:
        expected.pop("lm_head.weight", None)  # tied: same tensor as embed_tokens
    assert spec_from_config(config).hf_params() == expected


def test_spec_from_plain_dict_and_missing_key() -> None:
    spec = spec_from_config(
        {
            "hidden_size": 8,
            "num_attention_heads": 2,
            "intermediate_size": 4,
            "vocab_size": 10,
            "num_hidden_layers": 1,
        }
    )
    assert spec.num_kv_heads == 2 and spec.head_dim == 4 and not spec.qkv_bias
    with pytest.raises(UserError, match="vocab_size"):
        spec_from_config(
            {"hidden_size": 8, "num_attention_heads": 2, "intermediate_size": 4, "num_hidden_layers": 1}
        )


def test_fsdp_rows_follow_torch_chunk_including_empty_trailing_shards() -> None:
    for n in range(0, 12):
        for world in range(1, 9):
            chunks = torch.chunk(torch.arange(n), world) if n else ()
            for r in range(world):
                a, b = fsdp_shard_rows(n, world, r)
                want = chunks[r].tolist() if r < len(chunks) else []
                assert list(range(a, b)) == want, (n, world, r)


QWEN05 = {
    "model_type": "qwen2", "hidden_size": 896, "num_attention_heads": 14, "num_key_value_heads": 2,
    "intermediate_size": 4864, "vocab_size": 151936, "num_hidden_layers": 1, "tie_word_embeddings": True,
}  # fmt: skip


def test_qwen2_05b_rollout_shapes_and_limits() -> None:
    spec = spec_from_config(QWEN05)
    layout = rollout_layout(spec, 2)
    shapes = {t.name: t.shape for t in layout.ranks[0]}
    assert shapes["model.layers.0.self_attn.qkv_proj.weight"] == ((7 + 1 + 1) * 64, 896)
    assert shapes["model.layers.0.self_attn.qkv_proj.bias"] == (9 * 64,)
    assert shapes["model.layers.0.mlp.gate_up_proj.weight"] == (4864, 896)
    assert shapes["model.layers.0.self_attn.o_proj.weight"] == (896, 448)
    assert shapes["model.embed_tokens.weight"] == (151936 // 2, 896)
    assert "lm_head.weight" not in shapes  # tied: vLLM skips it
    with pytest.raises(UserError, match="num_attention_heads=14"):
        rollout_layout(spec, 4)


def test_kv_heads_replicated_when_tp_exceeds_kv_heads() -> None:
    spec = spec_from_config({**QWEN05, "num_attention_heads": 8, "hidden_size": 64})  # head_dim 8, 2 kv heads
    layout = rollout_layout(spec, 4)
    kv_rows = []
    for r in range(4):
        qkv = next(t for t in layout.ranks[r] if t.name.endswith("qkv_proj.weight"))
        k = next(b for b in qkv.blocks if "k_proj" in b.param)
        kv_rows.append((k.row0, k.row1))
    assert kv_rows == [(0, 8), (0, 8), (8, 16), (8, 16)]  # tp_rank // (tp / kv)


def test_vocab_padding_rows_are_zero_and_padded_vocab_must_split() -> None:
    spec = spec_from_config({**QWEN05, "vocab_size": 100, "tie_word_embeddings": False})
    layout = rollout_layout(spec, 2)  # padded to 128 -> 64 rows per rank
    emb = [next(t for t in layout.ranks[r] if t.name == "model.embed_tokens.weight") for r in range(2)]
    assert [e.shape[0] for e in emb] == [64, 64]
    assert [(b.row0, b.row1) for b in emb[1].blocks] == [(64, 100)] and emb[1].padded
    three = spec_from_config(
        {
            **QWEN05,
            "num_attention_heads": 6,
            "num_key_value_heads": 3,
            "hidden_size": 48,
            "intermediate_size": 12,
            "vocab_size": 100,
        }
    )
    assert "padded to 128" in (check_tp(three, 3) or "")
    assert (
        check_tp(
            spec_from_config(
                {
                    **QWEN05,
                    "num_attention_heads": 6,
                    "num_key_value_heads": 3,
                    "hidden_size": 48,
                    "intermediate_size": 12,
                    "vocab_size": 130,
                }
            ),
            3,
        )
        is None
    )


def test_rank_orders_and_world_checks() -> None:
    assert [tp_rank_of(r, 4, 2, "contiguous") for r in range(4)] == [0, 1, 0, 1]
    assert [tp_rank_of(r, 4, 2, "strided") for r in range(4)] == [0, 0, 1, 1]
    spec = spec_from_config({**QWEN05, "num_attention_heads": 8, "hidden_size": 64})
    with pytest.raises(UserError, match="not a multiple"):
        rollout_layout(spec, 2, world=3)
    with pytest.raises(UserError, match="tp=1"):
        rollout_layout(spec, 2, fmt="hf")
    assert len(fsdp_layout(spec, 2, world=4).ranks[3]) == 0  # q > p: extra ranks hold no train shard


def test_hf_format_is_full_unmerged_names() -> None:
    spec = spec_from_config({**QWEN05, "num_attention_heads": 8, "hidden_size": 64})
    layout = rollout_layout(spec, 1, world=2, fmt="hf")
    assert [t.name for t in layout.ranks[1]] == list(spec.hf_params())
    assert all(t.shape == spec.hf_params()[t.name] for t in layout.ranks[1])
