"""Packed training forwards (rlctl.engines.packing): one row per prompt group, results unchanged."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlctl.engines.fsdp_train import FSDPTrainEngine
from rlctl.engines.hf_model import load_causal_lm
from rlctl.engines.optim import OptimConfig
from rlctl.engines.packing import can_pack, pack, response_lengths
from rlctl.engines.prefix import PrefixGroups, prompt_groups
from tests.engines.helpers import (
    make_batch,
    make_grouped_batch,
    make_model,
    reference_log_probs,
    seq_mean_loss,
    token_mean_loss,
)

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model(tmp_path_factory.mktemp("m") / "model", tie=True, seed=7)


def _groups(batch, resp_len):
    plen = batch["input_ids"].shape[1] - resp_len
    found = prompt_groups(batch["input_ids"][:, :plen], batch["attention_mask"][:, :plen])
    return found or PrefixGroups.each_row(len(batch["input_ids"]))


@given(
    sizes=st.lists(st.integers(1, 4), min_size=1, max_size=4),
    prompt_len=st.integers(1, 5),
    resp_len=st.integers(1, 5),
    seed=st.integers(0, 10_000),
)
@settings(max_examples=60, deadline=None)
def test_each_response_token_sees_exactly_its_own_row(sizes, prompt_len, resp_len, seed):
    """The (token, position) pairs a packed position attends to are those the padded row's
    predicting position attends to, and the position's target is the response token."""
    parts = [
        make_grouped_batch(1, n=k, prompt_len=prompt_len, resp_len=resp_len, seed=seed + i)
        for i, k in enumerate(sizes)
    ]
    batch = {key: torch.cat([p[key] for p in parts]) for key in parts[0]}
    packed = pack(
        batch["input_ids"], batch["attention_mask"], batch["position_ids"], resp_len, _groups(batch, resp_len)
    )
    assert packed is not None
    plen = prompt_len
    rows, width = batch["input_ids"].shape
    length = packed.input_ids.shape[1]
    shared = length - packed.keep
    for i in range(rows):
        group = int(packed.source[i, 0]) // packed.keep
        for t in range(resp_len):
            if not batch["attention_mask"][i, plen + t]:
                assert not packed.valid[i, t]
                continue
            assert packed.valid[i, t]
            col = int(packed.source[i, t]) % packed.keep + shared
            assert packed.targets[group, col - shared] == batch["responses"][i, t]
            seen = {
                (int(packed.input_ids[group, k]), int(packed.position_ids[group, k]))
                for k in range(length)
                if packed.attention_mask[group, 0, col, k]
            }
            q = plen - 1 + t
            want = {
                (int(batch["input_ids"][i, k]), int(batch["position_ids"][i, k]))
                for k in range(q + 1)
                if batch["attention_mask"][i, k]
            }
            assert seen == want
            assert int(packed.position_ids[group, col]) == int(batch["position_ids"][i, q])


def test_a_response_with_a_hole_is_not_packed():
    mask = torch.tensor([[1, 1, 1, 0, 1]])
    assert response_lengths(mask, 3) is None
    assert response_lengths(torch.tensor([[0, 1, 1, 1, 0]]), 3).tolist() == [2]


@pytest.mark.parametrize("loss_fn", [token_mean_loss, seq_mean_loss], ids=["token-mean", "seq-mean"])
@pytest.mark.parametrize(
    "batch",
    [
        make_grouped_batch(3, n=4, resp_len=5, seed=2),
        make_grouped_batch(2, n=3, resp_len=1, seed=4),
        make_batch(6, seed=3),
    ],
    ids=["groups", "one-token", "distinct-prompts"],
)
def test_packed_forward_runs_one_row_per_group_with_the_plain_results(model_dir, loss_fn, batch):
    rows = len(batch["input_ids"])
    grads, outs, calls = {}, {}, {}
    for packed in (True, False):
        engine = FSDPTrainEngine(
            model_dir,
            micro_batch_size=rows,
            share_prefix=False,
            pack_sequences=packed,
            optim=OptimConfig(lr=0.0, grad_clip=0.0),
        )
        assert engine.pack is packed
        sizes: list[int] = []
        handle = engine.model.register_forward_pre_hook(
            lambda mod, args, kwargs, sizes=sizes: sizes.append(kwargs["input_ids"].shape[0]),
            with_kwargs=True,
        )
        outs[packed] = engine.compute_log_prob(batch, temperature=0.7, with_entropy=True)
        engine.train_batch(batch, loss_fn, temperature=0.7)
        handle.remove()
        calls[packed] = sizes
        grads[packed] = torch.cat([p.grad.flatten() for p in engine.model.parameters()])
    groups = len(_groups(batch, batch["responses"].shape[1]).first)
    assert calls[True] == [groups, groups]
    assert calls[False] == [rows, rows]
    mask = batch["response_mask"].bool()
    ref = reference_log_probs(engine.model, batch, temperature=0.7)
    assert (outs[True]["log_probs"][mask] - ref[mask]).abs().max() <= 1e-5
    assert (outs[True]["entropy"] - outs[False]["entropy"])[mask].abs().max() <= 1e-5
    assert (outs[True]["log_probs"][~mask] == 0).all()  # no token, no value
    assert grads[False].norm() > 0
    assert (grads[True] - grads[False]).norm() / grads[False].norm() <= 1e-5


def test_packed_values_equal_the_plain_critic(model_dir):
    batch = make_grouped_batch(2, n=3, resp_len=4, seed=5)
    values = {}
    for packed in (True, False):
        torch.manual_seed(0)  # the same fresh value head
        critic = FSDPTrainEngine(model_dir, value_head=True, share_prefix=False, pack_sequences=packed)
        assert critic.pack is packed
        values[packed] = critic.compute_values(batch)
    mask = batch["response_mask"].bool()
    assert (values[True] - values[False])[mask].abs().max() <= 1e-5


def test_only_sdpa_attention_is_packed(model_dir):
    assert can_pack(load_causal_lm(model_dir, attn_implementation="sdpa"))
    assert not can_pack(load_causal_lm(model_dir, attn_implementation="eager"))
    assert not FSDPTrainEngine(model_dir, attn_implementation="eager").pack


def test_rows_with_nothing_to_remove_keep_the_plain_forward(model_dir):
    """No shared prompt and no response padding: packing would only swap the causal kernel for a
    masked one (the sync canary's one row compares with the rollout engine's causal forward)."""
    from rlctl.trainer.state.canary import canary_batch

    engine = FSDPTrainEngine(model_dir)
    seen: list[object] = []
    handle = engine.model.register_forward_pre_hook(
        lambda mod, args, kwargs: seen.append(kwargs["attention_mask"].dim()), with_kwargs=True
    )
    engine.compute_log_prob(canary_batch(list(range(3, 19))))
    engine.compute_log_prob(make_grouped_batch(2, n=2, resp_len=3, seed=1))
    handle.remove()
    assert seen == [2, 4]  # the canary as given; a grouped batch packed (4-D mask)
