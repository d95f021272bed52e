"""In-flight weight swaps through vLLM's step loop and SGLang's refusal, against fakes of two releases each."""

from __future__ import annotations

import re

import pytest
import torch

from rlctl.engines.fsdp_train import FSDPTrainEngine
from rlctl.engines.sglang_rollout import SGLangRolloutEngine
from rlctl.engines.vllm_rollout import VLLMRolloutEngine
from rlctl.errors import UserError
from tests.engines.fakes import install
from tests.engines.helpers import PAD, make_batch, make_model

torch.set_num_threads(1)
CONTRACT = dict(device="cuda", dtype="float32", trust_remote_code=False)
T, STEPS, SWAP_AFTER = 0.7, 8, 3  # every row runs STEPS tokens (no stop); the swap comes after SWAP_AFTER


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    base = tmp_path_factory.mktemp("m")
    return make_model(base / "a", seed=1), make_model(base / "b", seed=2)


def _build(monkeypatch, tmp_path, models, package, version, **kw):
    calls: list = []
    install(monkeypatch, tmp_path, package, version, calls)
    cls = VLLMRolloutEngine if package == "vllm" else SGLangRolloutEngine
    return cls(str(models[0]), bucket_bytes=4096, **{**CONTRACT, **kw}), calls


def _swap_once(stream, after: int = SWAP_AFTER, to: int = 4):
    """``swap()`` that hands over version ``to`` on its ``after``-th call, nothing otherwise."""
    asked = {"n": 0}

    def swap():
        asked["n"] += 1
        return (to, stream) if asked["n"] == after else None

    return swap, asked


def _gen(engine, **kw):
    b = make_batch(2, prompt_len=6, resp_len=1, seed=0)
    return engine.generate(
        b["input_ids"][:, :6],
        b["attention_mask"][:, :6],
        n=2,
        temperature=T,
        max_new_tokens=STEPS,
        eos_token_id=None,
        pad_token_id=PAD,
        seed=5,
        **kw,
    )


def _scores(model_path, out):
    return FSDPTrainEngine(model_path).compute_log_prob(out, temperature=T)["log_probs"]


@pytest.mark.parametrize("version", ["0.13.0", "0.33.0"])
def test_vllm_recompute_swap_carries_both_versions_and_each_weights_scores(
    monkeypatch, tmp_path, models, version
):
    """A swap between steps: the running requests go on (none restarted), their tokens carry the old
    version then the new one, and with the KV cache recomputed (running requests preempted) each
    token's behaviour log-prob is the score of the weights it was sampled with."""
    engine, calls = _build(monkeypatch, tmp_path, models, "vllm", version, async_scheduling=False)
    swap, asked = _swap_once(FSDPTrainEngine(models[1]).export_weights("full"))
    out = _gen(engine, version=3, swap=swap, kv_on_swap="recompute")
    assert out["response_mask"].sum(-1).tolist() == [STEPS] * 4
    expected = torch.tensor([3] * SWAP_AFTER + [4] * (STEPS - SWAP_AFTER)).expand(4, -1)
    assert torch.equal(out["token_versions"], expected)
    assert sum(1 for c in calls if c[0] == "add_request") == 4  # nobody re-added: the sequences went on
    assert ("preempt", 4) in calls
    old, new = _scores(models[0], out), _scores(models[1], out)
    got = out["rollout_log_probs"]
    torch.testing.assert_close(got[:, :SWAP_AFTER], old[:, :SWAP_AFTER], atol=1e-5, rtol=0)
    torch.testing.assert_close(got[:, SWAP_AFTER:], new[:, SWAP_AFTER:], atol=1e-5, rtol=0)
    assert (got[:, SWAP_AFTER:] - old[:, SWAP_AFTER:]).abs().max() > 1e-2  # the swap did change them
    assert asked["n"] >= SWAP_AFTER


@pytest.mark.parametrize("version", ["0.10.2", "0.13.0"])
def test_vllm_keep_returns_what_the_engine_reported(monkeypatch, tmp_path, models, version):
    """``keep``: the old KV cache stays; the log-probs returned are those vLLM reported for each token
    (after the swap, the scores of neither policy: the gap to the new weights is not zero)."""
    engine, _ = _build(monkeypatch, tmp_path, models, "vllm", version)
    reported: dict[str, list[float]] = {}
    step = engine.llm.llm_engine.step

    def recording_step():
        outs = step()
        for o in outs:
            c = o.outputs[0]
            reported.setdefault(o.request_id, []).append(c.logprobs[-1][c.token_ids[-1]].logprob)
        return outs

    monkeypatch.setattr(engine.llm.llm_engine, "step", recording_step)
    swap, _ = _swap_once(FSDPTrainEngine(models[1]).export_weights("full"))
    out = _gen(engine, version=1, swap=swap, kv_on_swap="keep")
    want = torch.tensor([reported[rid] for rid in sorted(reported, key=lambda r: int(r.rsplit("-", 1)[1]))])
    torch.testing.assert_close(out["rollout_log_probs"], want, atol=0, rtol=0)
    assert (
        out["token_versions"][:, SWAP_AFTER:].eq(4).all()
        and out["token_versions"][:, :SWAP_AFTER].eq(1).all()
    )
    new = _scores(models[1], out)
    assert (out["rollout_log_probs"][:, SWAP_AFTER + 1 :] - new[:, SWAP_AFTER + 1 :]).abs().max() > 1e-4


def test_vllm_failed_swap_leaves_no_request_behind(monkeypatch, tmp_path, models):
    """A swap that raises aborts the batch's unfinished requests, so the next generate starts clean."""
    engine, _ = _build(monkeypatch, tmp_path, models, "vllm", "0.13.0")

    def failing_swap():
        raise RuntimeError("publisher gone")

    with pytest.raises(RuntimeError, match="publisher gone"):
        _gen(engine, version=0, swap=failing_swap, kv_on_swap="keep")
    assert not engine.llm.llm_engine.has_unfinished_requests()
    assert _gen(engine, version=1)["token_versions"].eq(1).all()


def test_vllm_recompute_refused_where_reset_prefix_cache_cannot_preempt(monkeypatch, tmp_path, models):
    engine, _ = _build(monkeypatch, tmp_path, models, "vllm", "0.10.2")
    swap, asked = _swap_once([])
    with pytest.raises(UserError, match=r"^vllm 0\.10\.2 cannot recompute running requests' KV cache"):
        _gen(engine, version=0, swap=swap, kv_on_swap="recompute")
    assert asked["n"] == 0


def test_vllm_stream_interval_above_one_refused(monkeypatch, tmp_path, models):
    """Tokens reported in groups of ``stream_interval`` cannot be attributed to a version: refused."""
    engine, _ = _build(monkeypatch, tmp_path, models, "vllm", "0.13.0", stream_interval=4)
    swap, asked = _swap_once([])
    with pytest.raises(UserError, match=r"^vllm 0\.13\.0 with stream_interval=4 .*stream_interval = 1$"):
        _gen(engine, version=0, swap=swap, kv_on_swap="keep")
    assert asked["n"] == 0


def test_vllm_async_scheduling_default_refused(monkeypatch, tmp_path, models):
    """0.33.0's EngineArgs.async_scheduling defaults to None (on where supported): a batch may be in
    flight between steps, so a swap is refused in one line naming the version and the fix."""
    engine, _ = _build(monkeypatch, tmp_path, models, "vllm", "0.33.0")
    swap, _ = _swap_once([])
    with pytest.raises(
        UserError, match=r"^vllm 0\.33\.0 with async_scheduling=None .*async_scheduling = false"
    ):
        _gen(engine, version=0, swap=swap, kv_on_swap="keep")


@pytest.mark.parametrize(
    "package,version", [("vllm", "0.10.2"), ("vllm", "0.33.0"), ("sglang", "0.5.3"), ("sglang", "0.5.23")]
)
def test_version_without_swap_tags_every_token(monkeypatch, tmp_path, models, package, version):
    engine, _ = _build(monkeypatch, tmp_path, models, package, version)
    out = _gen(engine, version=7)
    assert torch.equal(out["token_versions"], out["response_mask"] * 7)
    assert "token_versions" not in _gen(engine)


@pytest.mark.parametrize("version", ["0.5.3", "0.5.23"])
def test_sglang_swap_between_calls_carries_both_versions(monkeypatch, tmp_path, models, version):
    """SGLang: each request decodes ``swap_every`` tokens per Engine.generate call; after a swap it goes
    on as prompt + its tokens so far, prefilled under the new weights (the radix cache flushed), so
    each token's log-prob is the score of the weights it was sampled with."""
    engine, calls = _build(monkeypatch, tmp_path, models, "sglang", version)
    engine.swap_every = SWAP_AFTER
    swap, asked = _swap_once(FSDPTrainEngine(models[1]).export_weights("full"), after=1)
    out = _gen(engine, version=3, swap=swap)
    assert out["response_mask"].sum(-1).tolist() == [STEPS] * 4
    expected = torch.tensor([3] * SWAP_AFTER + [4] * (STEPS - SWAP_AFTER)).expand(4, -1)
    assert torch.equal(out["token_versions"], expected)
    gens = [c for c in calls if c[0] == "generate"]
    assert len(gens) == 3  # 8 tokens in calls of 3, 3, 2
    first, second = gens[0][1], gens[1][1]
    responses = out["responses"].tolist()
    assert [ids[len(p) :] for ids, p in zip(second, first, strict=True)] == [
        r[:SWAP_AFTER] for r in responses
    ]
    got = out["rollout_log_probs"]
    old, new = _scores(models[0], out), _scores(models[1], out)
    torch.testing.assert_close(got[:, :SWAP_AFTER], old[:, :SWAP_AFTER], atol=1e-5, rtol=0)
    torch.testing.assert_close(got[:, SWAP_AFTER:], new[:, SWAP_AFTER:], atol=1e-5, rtol=0)
    assert asked["n"] == 2  # asked after each call that left requests running


@pytest.mark.parametrize("package,version", [("vllm", "0.13.0"), ("sglang", "0.5.23")])
def test_unknown_kv_on_swap_refused(monkeypatch, tmp_path, models, package, version):
    engine, _ = _build(monkeypatch, tmp_path, models, package, version)
    with pytest.raises(UserError, match=r"^kv_on_swap must be one of \('recompute', 'keep'\), got 'drop'$"):
        _gen(engine, version=0, kv_on_swap="drop")


@pytest.mark.parametrize("version", ["0.5.3", "0.5.23"])
def test_sglang_keep_refused_naming_the_version(monkeypatch, tmp_path, models, version):
    engine, calls = _build(monkeypatch, tmp_path, models, "sglang", version)
    swap, asked = _swap_once([])
    with pytest.raises(UserError, match="^sglang " + re.escape(version) + " cannot keep the old KV cache"):
        _gen(engine, version=0, swap=swap, kv_on_swap="keep")
    assert asked["n"] == 0 and not any(c[0] == "generate" for c in calls)


def test_fake_step_engine_rejects_unknown_keywords(monkeypatch, tmp_path, models):
    engine, _ = _build(monkeypatch, tmp_path, models, "vllm", "0.13.0")
    sp = engine._vllm.SamplingParams(n=1, max_tokens=2)
    with pytest.raises(TypeError, match="session_id"):  # 0.33.0's keyword, absent in 0.13.0
        engine.llm.llm_engine.add_request("x", {"prompt_token_ids": [1, 2]}, sp, session_id="s")
