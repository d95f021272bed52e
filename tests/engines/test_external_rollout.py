"""vLLM and SGLang adapters against fakes of their APIs (the real engines cannot run here)."""

from __future__ import annotations

import sys

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from rlctl.engines.fsdp_train import FSDPTrainEngine
from rlctl.engines.registry import get_engine
from rlctl.engines.rollout_batch import assemble_rollout, unpadded_prompts
from rlctl.engines.sglang_rollout import SGLangRolloutEngine
from rlctl.engines.vllm_rollout import VLLMRolloutEngine
from rlctl.errors import RunError, UserError
from tests.engines.fakes import make_fake_sglang, make_fake_vllm
from tests.engines.helpers import EOS, PAD, make_batch, make_model

torch.set_num_threads(1)
STOPS = [EOS, *range(5, 16)]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    base = tmp_path_factory.mktemp("m")
    return make_model(base / "a", seed=1), make_model(base / "b", seed=2)


@pytest.fixture(params=["vllm", "sglang"])
def adapter(request, models, monkeypatch):
    calls: list = []
    if request.param == "vllm":
        monkeypatch.setitem(sys.modules, "vllm", make_fake_vllm(calls))
        engine = VLLMRolloutEngine(str(models[0]), bucket_bytes=4096)
    else:
        monkeypatch.setitem(sys.modules, "sglang", make_fake_sglang(calls))
        engine = SGLangRolloutEngine(str(models[0]), bucket_bytes=4096)
    return request.param, engine, calls


def _gen(engine, **kw):
    b = make_batch(3, prompt_len=6, resp_len=1, seed=0)
    kw.setdefault("temperature", 0.7)
    return engine.generate(
        b["input_ids"][:, :6],
        b["attention_mask"][:, :6],
        n=2,
        max_new_tokens=8,
        eos_token_id=STOPS,
        pad_token_id=PAD,
        generator=torch.Generator().manual_seed(1),
        **kw,
    )


def test_registered_for_cuda():
    assert get_engine("rollout", "qwen2", "vllm", "cuda") is VLLMRolloutEngine
    assert get_engine("rollout", "qwen2", "sglang", "cuda") is SGLangRolloutEngine


def test_generate_unpads_prompts_and_returns_the_batch_convention(adapter, models):
    name, engine, calls = adapter
    out = _gen(engine)
    prompts = calls[-1][1]
    b = make_batch(3, prompt_len=6, resp_len=1, seed=0)
    lens = b["attention_mask"][:, :6].sum(-1).tolist()
    assert [len(p) for p in prompts] == [n for n in lens for _ in range(2)]
    assert torch.equal(out["prompts"], b["input_ids"][:, :6].repeat_interleave(2, 0))
    assert out["responses"].shape == (6, 8)
    mask = out["response_mask"].bool()
    assert 0 < mask.sum() < mask.numel()
    assert torch.all(out["responses"][~mask] == PAD)
    recomputed = FSDPTrainEngine(models[0]).compute_log_prob(out, temperature=0.7)["log_probs"]
    assert torch.allclose(recomputed[mask], out["rollout_log_probs"][mask], atol=1e-5, rtol=0)
    params = calls[-1][2]
    if name == "vllm":
        assert params["max_tokens"] == 8 and params["stop_token_ids"] == STOPS and params["top_k"] == -1
        assert calls[0][1]["enable_sleep_mode"] and calls[0][1]["logprobs_mode"] == "processed_logprobs"
    else:
        assert params["max_new_tokens"] == 8 and params["stop_token_ids"] == STOPS and params["top_k"] == -1
        assert calls[0][1]["enable_memory_saver"]


def test_greedy_sets_temperature_zero(adapter):
    _, engine, calls = adapter
    _gen(engine, greedy=True)
    assert calls[-1][2]["temperature"] == 0.0


def test_update_weights_in_buckets_then_generation_uses_them(adapter, models):
    name, engine, calls = adapter
    new = FSDPTrainEngine(models[1])
    engine.sleep()
    with pytest.raises(RunError, match="asleep"):
        _gen(engine)
    count = engine.update_weights(new.export_weights("full"))
    engine.wake()
    assert count == len(list(new.model.parameters()))
    out = _gen(engine)
    mask = out["response_mask"].bool()
    lp = new.compute_log_prob(out, temperature=0.7)["log_probs"]
    assert torch.allclose(lp[mask], out["rollout_log_probs"][mask], atol=1e-5, rtol=0)
    kinds = [c[0] for c in calls]
    if name == "vllm":
        assert kinds.count("collective_rpc") > 1  # several buckets of <= 4 KiB
        assert ("wake_up", ["weights"]) in calls and ("wake_up", ["kv_cache"]) in calls
        assert kinds.index("reset_prefix_cache") > max(
            i for i, k in enumerate(kinds) if k == "collective_rpc"
        )
    else:
        updates = [c for c in calls if c[0] == "update_weights_from_tensor"]
        assert len(updates) > 1 and [u[2] for u in updates] == [False] * (len(updates) - 1) + [True]
        assert ("resume_memory_occupation", ["weights"]) in calls
        assert ("resume_memory_occupation", ["kv_cache"]) in calls


def test_vllm_without_logprobs_mode_falls_back(models, monkeypatch):
    calls: list = []
    monkeypatch.setitem(sys.modules, "vllm", make_fake_vllm(calls, reject_logprobs_mode=True))
    VLLMRolloutEngine(str(models[0]))
    assert "logprobs_mode" not in calls[0][1]


def test_missing_package_is_a_user_error(monkeypatch, models):
    monkeypatch.setitem(sys.modules, "vllm", None)
    monkeypatch.setitem(sys.modules, "sglang", None)
    with pytest.raises(UserError, match="vllm"):
        VLLMRolloutEngine(str(models[0]))
    with pytest.raises(UserError, match="sglang"):
        SGLangRolloutEngine(str(models[0]))


def test_assemble_rollout_checks_row_count():
    with pytest.raises(ValueError, match="expected 4"):
        assemble_rollout(
            torch.ones(2, 3, dtype=torch.long),
            torch.ones(2, 3),
            [[1]],
            [[0.0]],
            n=2,
            max_new_tokens=2,
            pad_token_id=0,
        )


@given(
    lens=st.lists(st.integers(0, 6), min_size=1, max_size=6),
    max_new=st.integers(1, 6),
)
def test_assemble_rollout_pads_and_masks_any_lengths(lens, max_new):
    n = 1
    prompts = torch.arange(3 * len(lens)).view(len(lens), 3) + 1
    pmask = torch.ones_like(prompts)
    pmask[:, 0] = 0
    responses = [list(range(10, 10 + k)) for k in lens]
    log_probs = [[-0.5 * (j + 1) for j in range(k)] for k in lens]
    out = assemble_rollout(prompts, pmask, responses, log_probs, n=n, max_new_tokens=max_new, pad_token_id=0)
    for i, k in enumerate(lens):
        k = min(k, max_new)
        assert out["response_mask"][i].tolist() == [1] * k + [0] * (max_new - k)
        assert out["responses"][i, :k].tolist() == responses[i][:k]
        assert torch.all(out["responses"][i, k:] == 0) and torch.all(out["rollout_log_probs"][i, k:] == 0)
    assert torch.equal(out["position_ids"], (out["attention_mask"].cumsum(-1) - 1).clamp(min=0))
    assert [len(p) for p in unpadded_prompts(prompts, pmask, 2)] == [2] * (2 * len(lens))
