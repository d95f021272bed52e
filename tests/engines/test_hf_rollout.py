"""HFRolloutEngine: log-probs agree with the training engine, EOS/padding, n, determinism, weights."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlctl.engines.fsdp_train import FSDPTrainEngine
from rlctl.engines.hf_rollout import HFRolloutEngine
from rlctl.errors import RunError, UserError
from tests.engines.helpers import EOS, PAD, make_batch, make_model

torch.set_num_threads(1)
EOS_SET = [EOS, *range(5, 16)]  # several stop tokens so rows end at different steps


@pytest.fixture(scope="module", params=[False, True], ids=["untied", "tied"])
def models(request, tmp_path_factory):
    base = tmp_path_factory.mktemp("m")
    return make_model(base / "a", tie=request.param, seed=1), make_model(
        base / "b", tie=request.param, seed=2
    )


def _prompts(batch_size: int = 4, seed: int = 0):
    b = make_batch(batch_size, prompt_len=6, resp_len=1, seed=seed)
    return b["input_ids"][:, :6], b["attention_mask"][:, :6]


def _gen(engine, seed=0, **kw):
    ids, mask = _prompts()
    kw.setdefault("max_new_tokens", 10)
    kw.setdefault("eos_token_id", EOS_SET)
    return engine.generate(ids, mask, pad_token_id=PAD, generator=torch.Generator().manual_seed(seed), **kw)


@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_rollout_log_probs_equal_training_engine_recompute(models, temperature):
    rollout = HFRolloutEngine(models[0])
    trainer = FSDPTrainEngine(models[0], micro_batch_size=3)
    out = _gen(rollout, n=2, temperature=temperature, top_k=20, top_p=0.9)
    mask = out["response_mask"].bool()
    assert 0 < mask.sum() < mask.numel()  # some rows stopped early
    recomputed = trainer.compute_log_prob(out, temperature=temperature)["log_probs"]
    assert torch.allclose(recomputed[mask], out["rollout_log_probs"][mask], atol=1e-5, rtol=0)
    assert torch.all(out["rollout_log_probs"][~mask] == 0)


def test_output_follows_the_batch_convention(models):
    out = _gen(HFRolloutEngine(models[0]), n=3)
    ids, pmask = _prompts()
    assert torch.equal(out["prompts"], ids.repeat_interleave(3, 0))
    assert out["responses"].shape == out["response_mask"].shape == out["rollout_log_probs"].shape == (12, 10)
    assert torch.equal(out["input_ids"], torch.cat([out["prompts"], out["responses"]], 1))
    assert torch.equal(
        out["attention_mask"], torch.cat([pmask.repeat_interleave(3, 0), out["response_mask"]], 1)
    )
    assert torch.equal(out["position_ids"], (out["attention_mask"].cumsum(-1) - 1).clamp(min=0))
    for row, rmask in zip(out["responses"], out["response_mask"], strict=True):
        length = int(rmask.sum())
        assert torch.all(rmask[:length] == 1) and torch.all(rmask[length:] == 0)
        stops = [i for i, t in enumerate(row[:length].tolist()) if t in EOS_SET]
        assert stops in ([], [length - 1])  # stops at the first EOS, which is kept
        if length < row.numel():
            assert stops == [length - 1]
            assert torch.all(row[length:] == PAD)


def test_same_seed_same_samples_other_seed_differs(models):
    engine = HFRolloutEngine(models[0])
    a, b, c = _gen(engine, seed=3), _gen(engine, seed=3), _gen(engine, seed=4)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["responses"], c["responses"])


def test_greedy_matches_model_generate_and_n_samples_are_adjacent(models):
    from transformers import AutoModelForCausalLM

    engine = HFRolloutEngine(models[0])
    out = _gen(engine, n=2, greedy=True, eos_token_id=EOS, max_new_tokens=8)
    assert torch.equal(out["responses"][0::2], out["responses"][1::2])
    ids, mask = _prompts()
    model = AutoModelForCausalLM.from_pretrained(models[0])
    ref = model.generate(
        input_ids=ids,
        attention_mask=mask,
        do_sample=False,
        max_new_tokens=8,
        eos_token_id=EOS,
        pad_token_id=PAD,
    )[:, 6:]
    assert torch.equal(out["responses"][0::2, : ref.shape[1]], ref)
    assert torch.all(out["responses"][:, ref.shape[1] :] == PAD)
    top1 = _gen(engine, n=2, top_k=1, eos_token_id=EOS, max_new_tokens=8, seed=9)
    assert torch.equal(top1["responses"], out["responses"])


def test_update_weights_switches_generation_to_the_new_weights(models):
    rollout = HFRolloutEngine(models[0])
    old_trainer = FSDPTrainEngine(models[0])
    new_trainer = FSDPTrainEngine(models[1])
    count = rollout.update_weights(new_trainer.export_weights("full"))
    assert count == len(list(new_trainer.model.parameters()))
    out = _gen(rollout, temperature=0.7)
    mask = out["response_mask"].bool()
    new_lp = new_trainer.compute_log_prob(out, temperature=0.7)["log_probs"]
    old_lp = old_trainer.compute_log_prob(out, temperature=0.7)["log_probs"]
    assert torch.allclose(new_lp[mask], out["rollout_log_probs"][mask], atol=1e-5, rtol=0)
    assert (old_lp[mask] - out["rollout_log_probs"][mask]).abs().max() > 1e-2


def test_update_weights_rejects_unknown_names_and_shapes(models):
    rollout = HFRolloutEngine(models[0])
    with pytest.raises(RunError, match="no parameter"):
        rollout.update_weights([("model.nope.weight", torch.zeros(1))])
    with pytest.raises(RunError, match="shape"):
        rollout.update_weights([("model.norm.weight", torch.zeros(3))])


def test_sleep_blocks_generation_until_wake(models):
    engine = HFRolloutEngine(models[0])
    ref = _gen(engine)
    engine.sleep()
    with pytest.raises(RunError, match="asleep"):
        _gen(engine)
    engine.wake()
    again = _gen(engine)
    assert torch.equal(ref["responses"], again["responses"])


def test_bad_sampling_arguments_are_user_errors(models):
    engine = HFRolloutEngine(models[0])
    with pytest.raises(UserError, match="temperature"):
        _gen(engine, temperature=0.0)
    with pytest.raises(UserError, match="max_new_tokens"):
        _gen(engine, max_new_tokens=0)


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    path = make_model(tmp_path_factory.mktemp("p") / "m", seed=4)
    return HFRolloutEngine(path), FSDPTrainEngine(path, micro_batch_size=4)


@settings(max_examples=8)
@given(
    lens=st.lists(st.integers(1, 7), min_size=1, max_size=4),
    n=st.integers(1, 3),
    temperature=st.sampled_from([0.5, 0.7, 1.0, 1.3]),
    top_p=st.sampled_from([1.0, 0.8]),
    seed=st.integers(0, 2**16),
)
def test_log_probs_agree_for_any_padding_pattern(engines, lens, n, temperature, top_p, seed):
    rollout, trainer = engines
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 64, (len(lens), 7), generator=g)
    mask = torch.zeros_like(ids)
    for i, length in enumerate(lens):
        mask[i, 7 - length :] = 1
    ids = ids * mask
    out = rollout.generate(
        ids,
        mask,
        n=n,
        temperature=temperature,
        top_p=top_p,
        max_new_tokens=5,
        eos_token_id=EOS_SET,
        generator=g,
    )
    rmask = out["response_mask"].bool()
    recomputed = trainer.compute_log_prob(out, temperature=temperature)["log_probs"]
    assert torch.allclose(recomputed[rmask], out["rollout_log_probs"][rmask], atol=1e-5, rtol=0)
