"""HFRolloutEngine: log-probs agree with the training engine, EOS/padding, n, determinism, weights,
and the device contract (seeded on the engine's device, outputs on the host), on every test device."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlctl.dispatch import DataProto
from rlctl.dispatch.mesh import Mesh
from rlctl.engines import hf_rollout
from rlctl.engines.fsdp_train import FSDPTrainEngine
from rlctl.engines.hf_rollout import HFRolloutEngine
from rlctl.errors import RunError, UserError
from rlctl.trainer.workers.roles import PolicyWorker, _pad_responses
from tests.engines.helpers import EOS, PAD, log_prob_atol, make_batch, make_model

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
    return engine.generate(ids, mask, pad_token_id=PAD, seed=seed, **kw)


def _on_host(out: dict[str, torch.Tensor]) -> bool:
    return all(v.device.type == "cpu" for v in out.values())


@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_rollout_log_probs_equal_training_engine_recompute(models, device, temperature):
    rollout = HFRolloutEngine(models[0], device=device)
    trainer = FSDPTrainEngine(models[0], device=device, micro_batch_size=3)
    out = _gen(rollout, n=2, temperature=temperature, top_k=20, top_p=0.9)
    mask = out["response_mask"].bool()
    assert 0 < mask.sum() < mask.numel()  # some rows stopped early
    recomputed = trainer.compute_log_prob(out, temperature=temperature)["log_probs"]
    atol = log_prob_atol(device)
    assert torch.allclose(recomputed[mask], out["rollout_log_probs"][mask], atol=atol, rtol=0)
    assert torch.all(out["rollout_log_probs"][~mask] == 0)


def test_output_follows_the_batch_convention(models, device):
    out = _gen(HFRolloutEngine(models[0], device=device), n=3)
    assert _on_host(out)
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


def test_same_seed_same_samples_other_seed_differs(models, device):
    engine = HFRolloutEngine(models[0], device=device)
    a, b, c = _gen(engine, seed=3), _gen(engine, seed=3), _gen(engine, seed=4)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["responses"], c["responses"])
    unseeded = [_gen(engine, seed=None)["responses"] for _ in range(3)]
    assert not all(torch.equal(unseeded[0], u) for u in unseeded[1:])


def test_draws_use_one_generator_on_the_engine_device(models, device, monkeypatch):
    seen = []
    real = hf_rollout.draw_uniforms

    def spy(shape, device, generator):
        uniforms = real(shape, device, generator)
        seen.append((generator, uniforms.device))
        return uniforms

    monkeypatch.setattr(hf_rollout, "draw_uniforms", spy)
    engine = HFRolloutEngine(models[0], device=device)
    _gen(engine, seed=5, max_new_tokens=4, eos_token_id=None)
    assert len(seen) == 4 and len({id(g) for g, _ in seen}) == 1  # one generator for the whole call
    gen, logits_device = seen[0]
    assert gen.device.type == logits_device.type == engine.device.type == device
    assert gen.initial_seed() == 5
    seen.clear()
    _gen(engine, seed=None, max_new_tokens=2, eos_token_id=None)
    assert [g for g, _ in seen] == [None, None]


def test_inputs_on_the_engine_device_still_give_host_outputs(models, device):
    engine = HFRolloutEngine(models[0], device=device)
    ids, mask = _prompts()
    host = engine.generate(ids, mask, max_new_tokens=6, pad_token_id=PAD, seed=2)
    moved = engine.generate(ids.to(device), mask.to(device), max_new_tokens=6, pad_token_id=PAD, seed=2)
    assert _on_host(host) and _on_host(moved)
    assert all(torch.equal(host[k], moved[k]) for k in host)


def _policy_worker(engine: HFRolloutEngine, rank: int) -> PolicyWorker:
    """A PolicyWorker with only its rollout engine, outside any worker group (two ranks, each its
    own rollout replica)."""
    worker = PolicyWorker.__new__(PolicyWorker)
    worker._rlctl_ctx = SimpleNamespace(rank=rank, mesh=Mesh.of(None, 2))
    worker.rollout = engine
    return worker


def test_worker_generate_sequences_seeds_per_rank_and_returns_host_tensors(models, device):
    engine = HFRolloutEngine(models[0], device=device)
    ids, mask = _prompts()
    meta = {"seed": 7, "max_new_tokens": 5, "eos_token_id": EOS_SET, "pad_token_id": PAD, "temperature": 0.9}
    request = DataProto.from_dict(tensors={"input_ids": ids, "attention_mask": mask}, meta=meta)
    outs = [_policy_worker(engine, rank).generate_sequences(request).batch for rank in (0, 1)]
    for rank, out in enumerate(outs):
        assert _on_host(out)
        # the integer the worker used to seed a CPU generator with: CPU runs keep their numbers
        direct = engine.generate(
            ids,
            mask,
            max_new_tokens=5,
            temperature=0.9,
            eos_token_id=EOS_SET,
            pad_token_id=PAD,
            seed=7 * 1_000_003 + rank,
        )
        assert all(torch.equal(out[k], direct[k]) for k in direct)
    assert not torch.equal(outs[0]["responses"], outs[1]["responses"])


@pytest.mark.parametrize("where", ["cpu", "meta"])
def test_pad_responses_pads_on_each_tensors_own_device_and_dtype(where):
    b, p, r = 3, 4, 2
    out = {
        "responses": torch.ones(b, r, dtype=torch.int32, device=where),
        "input_ids": torch.ones(b, p + r, dtype=torch.int32, device=where),
        "response_mask": torch.ones(b, r, dtype=torch.long, device=where),
        "attention_mask": torch.ones(b, p + r, dtype=torch.bool, device=where),
        "position_ids": torch.arange(p + r, device=where).expand(b, -1).to(torch.int32),
        "rollout_log_probs": torch.zeros(b, r, dtype=torch.bfloat16, device=where),
    }
    padded = _pad_responses(out, 5, pad_id=9)
    for k, v in padded.items():
        assert (v.device.type, v.dtype) == (out[k].device.type, out[k].dtype), k
        assert v.shape[1] == out[k].shape[1] + 3, k
    if where == "cpu":
        assert padded["position_ids"][0].tolist() == list(range(p + r + 3))
        assert padded["responses"][0].tolist() == [1, 1, 9, 9, 9]
        assert padded["attention_mask"][0, -3:].tolist() == [False] * 3


def test_greedy_matches_model_generate_and_n_samples_are_adjacent(models, device):
    from transformers import AutoModelForCausalLM

    engine = HFRolloutEngine(models[0], device=device)
    out = _gen(engine, n=2, greedy=True, eos_token_id=EOS, max_new_tokens=8)
    assert torch.equal(out["responses"][0::2], out["responses"][1::2])
    ids, mask = _prompts()
    model = AutoModelForCausalLM.from_pretrained(models[0]).to(device)
    ref = model.generate(
        input_ids=ids.to(device),
        attention_mask=mask.to(device),
        do_sample=False,
        max_new_tokens=8,
        eos_token_id=EOS,
        pad_token_id=PAD,
    )[:, 6:].cpu()
    assert torch.equal(out["responses"][0::2, : ref.shape[1]], ref)
    assert torch.all(out["responses"][:, ref.shape[1] :] == PAD)
    top1 = _gen(engine, n=2, top_k=1, eos_token_id=EOS, max_new_tokens=8, seed=9)
    assert torch.equal(top1["responses"], out["responses"])


def test_update_weights_switches_generation_to_the_new_weights(models, device):
    rollout = HFRolloutEngine(models[0], device=device)
    old_trainer = FSDPTrainEngine(models[0], device=device)
    new_trainer = FSDPTrainEngine(models[1], device=device)
    count = rollout.update_weights(new_trainer.export_weights("full"))
    assert count == len(list(new_trainer.model.parameters()))
    out = _gen(rollout, temperature=0.7)
    mask = out["response_mask"].bool()
    new_lp = new_trainer.compute_log_prob(out, temperature=0.7)["log_probs"]
    old_lp = old_trainer.compute_log_prob(out, temperature=0.7)["log_probs"]
    assert torch.allclose(new_lp[mask], out["rollout_log_probs"][mask], atol=log_prob_atol(device), rtol=0)
    assert (old_lp[mask] - out["rollout_log_probs"][mask]).abs().max() > 1e-2


def test_update_weights_takes_tensors_from_another_device_and_dtype(models, device):
    rollout = HFRolloutEngine(models[0], device=device)
    source = FSDPTrainEngine(models[1])  # CPU, fp32; streamed as bf16 host tensors
    rollout.update_weights(source.export_weights("full", dtype=torch.bfloat16))
    for name, target in rollout.model.named_parameters():
        assert (target.device.type, target.dtype) == (device, torch.float32), name
    expect = dict(source.export_weights("full", dtype=torch.bfloat16))
    got = dict(rollout.model.named_parameters())
    assert all(torch.equal(got[k].cpu(), v.float()) for k, v in expect.items())


def test_update_weights_rejects_unknown_names_and_shapes(models):
    rollout = HFRolloutEngine(models[0])
    with pytest.raises(RunError, match="no parameter"):
        rollout.update_weights([("model.nope.weight", torch.zeros(1))])
    with pytest.raises(RunError, match="shape"):
        rollout.update_weights([("model.norm.weight", torch.zeros(3))])


def test_sleep_blocks_generation_until_wake(models, device):
    engine = HFRolloutEngine(models[0], device=device)
    ref = _gen(engine)
    engine.sleep()
    # an accelerator engine hands its weights to the host while asleep; a CPU one keeps them
    assert {p.device.type for p in engine.model.parameters()} == {"cpu"}
    with pytest.raises(RunError, match="asleep"):
        _gen(engine)
    engine.wake()
    assert {p.device.type for p in engine.model.parameters()} == {device}
    again = _gen(engine)
    assert torch.equal(ref["responses"], again["responses"])


def test_bad_sampling_arguments_are_user_errors(models):
    engine = HFRolloutEngine(models[0])
    with pytest.raises(UserError, match="temperature"):
        _gen(engine, temperature=0.0)
    with pytest.raises(UserError, match="max_new_tokens"):
        _gen(engine, max_new_tokens=0)


@pytest.fixture(scope="module")
def engines(tmp_path_factory, device):
    path = make_model(tmp_path_factory.mktemp("p") / "m", seed=4)
    return HFRolloutEngine(path, device=device), FSDPTrainEngine(path, device=device, micro_batch_size=4)


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
        seed=seed,
    )
    rmask = out["response_mask"].bool()
    recomputed = trainer.compute_log_prob(out, temperature=temperature)["log_probs"]
    atol = log_prob_atol(rollout.device.type)
    assert torch.allclose(recomputed[rmask], out["rollout_log_probs"][rmask], atol=atol, rtol=0)
