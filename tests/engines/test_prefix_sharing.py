"""Shared prompt prefixes (rlctl.engines.prefix): each distinct prompt runs once, results unchanged."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlctl.engines import hf_rollout
from rlctl.engines.fsdp_train import FSDPTrainEngine
from rlctl.engines.hf_rollout import HFRolloutEngine
from rlctl.engines.optim import OptimConfig
from rlctl.engines.prefix import prompt_groups
from tests.engines.helpers import (
    EOS,
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


def _batch_sizes_of_forwards(model: torch.nn.Module) -> tuple[list[int], object]:
    """Record the batch size of every top-level forward call of ``model``."""
    sizes: list[int] = []
    handle = model.register_forward_pre_hook(
        lambda mod, args, kwargs: sizes.append(kwargs["input_ids"].shape[0]), with_kwargs=True
    )
    return sizes, handle


@given(
    groups=st.lists(st.integers(1, 4), min_size=1, max_size=6),
    width=st.integers(1, 5),
    seed=st.integers(0, 10_000),
)
@settings(max_examples=60, deadline=None)
def test_prompt_groups_are_the_runs_of_equal_rows(groups, width, seed):
    g = torch.Generator().manual_seed(seed)
    distinct = torch.randint(0, 3, (len(groups), width), generator=g)
    ids = torch.cat([distinct[i : i + 1].expand(k, width) for i, k in enumerate(groups)])
    mask = torch.ones_like(ids)
    found = prompt_groups(ids, mask)
    # reference: a new group wherever a row differs from the one before
    starts = [i for i in range(len(ids)) if i == 0 or not torch.equal(ids[i], ids[i - 1])]
    if len(starts) == len(ids):
        assert found is None
        return
    assert found is not None
    assert found.first.tolist() == starts
    assert torch.equal(ids[found.first][found.row_group], ids)  # every row is its group's prompt


def test_rows_differing_only_in_the_mask_are_not_shared():
    ids = torch.tensor([[5, 6], [5, 6]])
    assert prompt_groups(ids, torch.tensor([[1, 1], [0, 1]])) is None
    assert prompt_groups(ids, torch.tensor([[1, 1], [1, 1]])) is not None


@pytest.mark.parametrize("loss_fn", [token_mean_loss, seq_mean_loss], ids=["token-mean", "seq-mean"])
@pytest.mark.parametrize("resp_len", [1, 5])
def test_training_forward_runs_each_prompt_once_and_gives_the_same_gradients(model_dir, loss_fn, resp_len):
    batch = make_grouped_batch(3, n=4, resp_len=resp_len, seed=2)
    grads, log_probs, calls = {}, {}, {}
    for share in (True, False):
        engine = FSDPTrainEngine(
            model_dir,
            micro_batch_size=12,
            share_prefix=share,
            pack_sequences=False,  # the two-pass path (packing: tests/engines/test_packing.py)
            optim=OptimConfig(lr=0.0, grad_clip=0.0),
        )
        sizes, handle = _batch_sizes_of_forwards(engine.model)
        log_probs[share] = engine.compute_log_prob(batch, with_entropy=True)
        engine.train_batch(batch, loss_fn)
        handle.remove()
        calls[share] = sizes
        grads[share] = torch.cat([p.grad.flatten() for p in engine.model.parameters()])
    # shared: the 3 prompts, then the 12 responses on their cache (one call when R == 1)
    assert calls[True] == ([3] if resp_len == 1 else [3, 12]) * 2
    assert calls[False] == [12, 12]
    ref = reference_log_probs(engine.model, batch)
    mask = batch["response_mask"].bool()
    for share in (True, False):
        assert (log_probs[share]["log_probs"][mask] - ref[mask]).abs().max() <= 1e-5
    assert (log_probs[True]["entropy"] - log_probs[False]["entropy"])[mask].abs().max() <= 1e-5
    assert grads[False].norm() > 0
    assert (grads[True] - grads[False]).norm() / grads[False].norm() <= 1e-5


def test_distinct_prompts_and_activation_checkpointing_take_the_plain_forward(model_dir):
    engine = FSDPTrainEngine(model_dir, micro_batch_size=8, pack_sequences=False)
    sizes, handle = _batch_sizes_of_forwards(engine.model)
    engine.compute_log_prob(make_batch(8, seed=3))  # every prompt differs
    handle.remove()
    assert sizes == [8]
    ckpt = FSDPTrainEngine(model_dir, micro_batch_size=8, activation_checkpointing=True, pack_sequences=False)
    assert not ckpt.share_prefix
    sizes, handle = _batch_sizes_of_forwards(ckpt.model)
    ckpt.train_batch(make_grouped_batch(2, n=4, seed=3), token_mean_loss)
    handle.remove()
    assert sizes == [8]


@pytest.mark.parametrize("n", [1, 4])
def test_rollout_prefill_runs_each_prompt_once_with_identical_samples(model_dir, monkeypatch, n):
    engine = HFRolloutEngine(model_dir)
    base = make_batch(3, seed=4)
    prompts, pmask = base["input_ids"][:, :6], base["attention_mask"][:, :6]
    if n == 1:  # the driver's layout: rows already repeated, n=1 per row
        prompts, pmask = prompts.repeat_interleave(4, 0), pmask.repeat_interleave(4, 0)
    kw = dict(n=n, temperature=0.9, max_new_tokens=6, eos_token_id=EOS, seed=11)
    sizes, handle = _batch_sizes_of_forwards(engine.model)
    shared = engine.generate(prompts, pmask, **kw)
    handle.remove()
    assert sizes[0] == 3 and set(sizes[1:]) == {12}  # prefill per distinct prompt, decode per row
    monkeypatch.setattr(hf_rollout, "prompt_groups", lambda ids, mask: None)
    plain = engine.generate(prompts, pmask, **kw)
    for key, value in plain.items():
        assert torch.allclose(shared[key].float(), value.float(), atol=1e-6, rtol=0), key


def _dynamic_rope_model(path):
    """A tiny Qwen2 with ``rope_type = dynamic`` whose 8 original positions the 11-token rows pass:
    the full forward rotates with rescaled frequencies, a 6-token prompt pass with the original ones."""
    return make_model(path, tie=True, seed=5, max_position_embeddings=8,
                      rope_scaling={"rope_type": "dynamic", "factor": 4.0})  # fmt: skip


def test_length_dependent_rope_is_read_as_transformers_does():
    from types import SimpleNamespace

    from rlctl.engines.prefix import length_dependent_rope

    def cfg(**kw):
        return SimpleNamespace(**kw)

    assert length_dependent_rope(cfg(rope_parameters={"rope_type": "dynamic", "factor": 2.0})) == "dynamic"
    assert length_dependent_rope(cfg(rope_scaling={"type": "longrope"})) == "longrope"
    nested = {"full_attention": {"rope_type": "default"}, "sliding_attention": {"rope_type": "dynamic"}}
    assert length_dependent_rope(cfg(rope_parameters=nested)) == "dynamic"
    for plain in (
        {"rope_type": "default"},
        {"rope_type": "linear", "factor": 2.0},
        {"rope_type": "yarn"},
        None,
    ):
        assert length_dependent_rope(cfg(rope_parameters=plain, rope_scaling=plain)) is None
    assert length_dependent_rope(cfg()) is None


def test_dynamic_rope_refuses_prefix_sharing_and_equals_the_plain_forward(tmp_path):
    from rlctl.engines.prefix import PrefixGroups, prompt_groups, shared_prefix_logits

    model_dir = _dynamic_rope_model(tmp_path / "dyn")
    batch = make_grouped_batch(3, n=4, resp_len=5, seed=2)  # 6 prompt + 5 response tokens
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "position_ids")}
    grads, log_probs = {}, {}
    for share in (True, False):
        engine = FSDPTrainEngine(
            model_dir, micro_batch_size=12, share_prefix=share, optim=OptimConfig(lr=0.0, grad_clip=0.0)
        )
        assert not engine.share_prefix
        sizes, handle = _batch_sizes_of_forwards(engine.model)
        log_probs[share] = engine.compute_log_prob(batch)["log_probs"]
        engine.train_batch(batch, token_mean_loss)
        handle.remove()
        assert sizes == [12, 12]  # the plain forward, no prompt pass
        grads[share] = torch.cat([p.grad.flatten() for p in engine.model.parameters()])
    ref = reference_log_probs(engine.model, batch)
    mask = batch["response_mask"].bool()
    assert (log_probs[True][mask] - ref[mask]).abs().max() <= 1e-5
    assert torch.equal(grads[True], grads[False])
    # what sharing would have given: the prompt pass rotated with the unscaled frequencies
    groups = prompt_groups(batch["input_ids"][:, :6], batch["attention_mask"][:, :6])
    assert isinstance(groups, PrefixGroups)
    with torch.no_grad():
        two_pass = shared_prefix_logits(
            engine.model, **inputs, response_length=5, groups=groups, keep_logits=False
        )
    plain = engine.model(**inputs).logits[:, -6:-1]
    assert (two_pass - plain).abs().max() > 1e-3
    # the rollout's prefill is not shared either
    rollout = HFRolloutEngine(model_dir)
    sizes, handle = _batch_sizes_of_forwards(rollout.model)
    rollout.generate(batch["input_ids"][:, :6], batch["attention_mask"][:, :6], max_new_tokens=2, seed=1)
    handle.remove()
    assert sizes[0] == 12
