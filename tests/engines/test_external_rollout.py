"""vLLM and SGLang adapters against fakes built from the recorded surfaces of the floor and newest releases."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from rlctl.engines.fsdp_train import FSDPTrainEngine
from rlctl.engines.registry import get_engine
from rlctl.engines.rollout_batch import assemble_rollout, row_seeds, unpadded_prompts
from rlctl.engines.sglang_rollout import SGLangRolloutEngine
from rlctl.engines.vllm_rollout import VLLMRolloutEngine
from rlctl.errors import RunError, UserError
from tests.engines.fakes import SGLANG_VERSIONS, VLLM_VERSIONS, install, load_surface
from tests.engines.helpers import EOS, PAD, make_batch, make_model

torch.set_num_threads(1)
STOPS = [EOS, *range(5, 16)]
CONTRACT = dict(device="cuda", dtype="float32", trust_remote_code=False)
VERSIONS = [("vllm", v) for v in VLLM_VERSIONS] + [("sglang", v) for v in SGLANG_VERSIONS]
IDS = [f"{p}-{v}" for p, v in VERSIONS]
ENGINES = {"vllm": VLLMRolloutEngine, "sglang": SGLangRolloutEngine}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    base = tmp_path_factory.mktemp("m")
    return make_model(base / "a", seed=1), make_model(base / "b", seed=2)


def build(monkeypatch, tmp_path, models, package, version, surface=None, **kw):
    calls: list = []
    install(monkeypatch, tmp_path, package, version, calls, surface)
    engine = ENGINES[package](str(models[0]), bucket_bytes=4096, **{**CONTRACT, **kw})
    return engine, calls


@pytest.fixture(params=VERSIONS, ids=IDS)
def adapter(request, models, monkeypatch, tmp_path):
    package, version = request.param
    engine, calls = build(monkeypatch, tmp_path, models, package, version)
    return package, version, engine, calls


def _gen(engine, n=2, **kw):
    b = make_batch(3, prompt_len=6, resp_len=1, seed=0)
    kw.setdefault("temperature", 0.7)
    kw.setdefault("top_p", 1.0)
    kw.setdefault("top_k", 0)
    kw.setdefault("seed", 1)
    return engine.generate(
        b["input_ids"][:, :6],
        b["attention_mask"][:, :6],
        n=n,
        max_new_tokens=8,
        eos_token_id=STOPS,
        pad_token_id=PAD,
        **kw,
    )


def _reference(model_path, out, temperature):
    """rlctl's convention, recomputed by the training engine: log_softmax(logits / T), untruncated."""
    return FSDPTrainEngine(model_path).compute_log_prob(out, temperature=temperature)["log_probs"]


# -- construction: only keywords the version has -------------------------------------------------------
def test_registered_per_vendor():
    """The registry is keyed by vendor: vLLM on NVIDIA, ROCm and Ascend (vllm-ascend), SGLang on
    NVIDIA and ROCm only; no vendor, or another one, finds neither."""
    for device, vendor in (("cuda", "nvidia"), ("cuda", "rocm"), ("npu", "ascend")):
        assert get_engine("rollout", "qwen2", "vllm", device, vendor) is VLLMRolloutEngine
    for vendor in ("nvidia", "rocm"):
        assert get_engine("rollout", "qwen2", "sglang", "cuda", vendor) is SGLangRolloutEngine
    for backend, device, vendor in (
        ("sglang", "npu", "ascend"),
        ("vllm", "cuda", None),
        ("vllm", "cuda", "xpu"),
    ):
        with pytest.raises(UserError, match=f"no rollout engine for backend='{backend}'"):
            get_engine("rollout", "qwen2", backend, device, vendor)


@pytest.mark.parametrize(("package", "version"), VERSIONS, ids=IDS)
def test_old_adapter_keywords_raise_like_the_real_library(package, version, models, monkeypatch, tmp_path):
    """The trainer's attn_implementation forwarded verbatim (the old adapters) fails on every release."""
    calls: list = []
    install(monkeypatch, tmp_path, package, version, calls)
    if package == "vllm":
        with pytest.raises(TypeError, match=r"^EngineArgs\.__init__\(\) got an unexpected keyword argument "):
            sys.modules["vllm"].LLM(model=str(models[0]), attn_implementation="sdpa")
    else:
        kind = load_surface("sglang", version)["ServerArgs"]["kind"]
        msg = r"^Unexpected keyword argument" if kind == "msgspec" else r"^ServerArgs\.__init__\(\) got an"
        with pytest.raises(TypeError, match=msg):
            sys.modules["sglang"].Engine(model_path=str(models[0]), attn_implementation="sdpa")
    assert calls == []


@pytest.mark.parametrize(("package", "version"), VERSIONS, ids=IDS)
def test_constructs_with_only_recorded_keywords(package, version, models, monkeypatch, tmp_path):
    _, calls = build(monkeypatch, tmp_path, models, package, version)
    surface = load_surface(package, version)
    passed = calls[0][1]
    if package == "vllm":
        assert set(passed) <= set(surface["EngineArgs"]["fields"])
        assert passed["enable_sleep_mode"] and passed["logprobs_mode"] == "processed_logprobs"
        assert passed["gpu_memory_utilization"] == 0.5 and passed["tensor_parallel_size"] == 1
        assert "attention_config" not in passed  # vLLM's own choice
    else:
        assert set(passed) <= set(surface["ServerArgs"]["fields"])
        assert passed["enable_memory_saver"] and passed["enable_weights_cpu_backup"]
        assert passed["mem_fraction_static"] == 0.5 and passed["tp_size"] == 1
        assert "attention_backend" not in passed  # SGLang's own choice, never a forced fa3


@pytest.mark.parametrize(("package", "version"), VERSIONS, ids=IDS)
def test_engine_keywords_reach_the_engine_or_name_key_and_version(
    package, version, models, monkeypatch, tmp_path
):
    """Engine keywords (platform settings + rollout.engine_kwargs) go to the engine when the version
    has the field, and an unknown one is a UserError naming the key and the installed version
    (the real libraries raise a bare TypeError from inside EngineArgs / ServerArgs)."""
    known = {"vllm": {"enforce_eager": True}, "sglang": {"attention_backend": "triton"}}[package]
    _, calls = build(monkeypatch, tmp_path, models, package, version, **known)
    assert {k: calls[0][1][k] for k in known} == known
    with pytest.raises(
        UserError, match=rf"rollout\.engine_kwargs\.max_mode_len: {package} {version} has no "
    ):
        build(monkeypatch, tmp_path, models, package, version, max_mode_len=4096)
    with pytest.raises(UserError, match=r"rollout\.engine_kwargs\.attn_implementation: "):
        build(monkeypatch, tmp_path, models, package, version, attn_implementation="sdpa")


def test_attention_config_is_refused_by_the_floor(models, monkeypatch, tmp_path):
    """vLLM 0.10.2 has no attention_config: passing it (as for 0.33) would fail construction."""
    install(monkeypatch, tmp_path, "vllm", "0.10.2", [])
    with pytest.raises(TypeError, match="unexpected keyword argument 'attention_config'"):
        sys.modules["vllm"].LLM(model=str(models[0]), attention_config={"backend": "FLASH_ATTN"})


@pytest.mark.parametrize("version", ["0.13.0", "0.33.0"])
def test_vllm_tensor_parallel_needs_the_trainers_process_group(version, models, monkeypatch, tmp_path):
    """vLLM's external launcher joins the trainer's world: without one, a one-line refusal."""
    with pytest.raises(UserError, match=r"^rollout\.tensor_parallel = 2 with rollout\.engine = 'vllm': no initialised"):
        build(monkeypatch, tmp_path, models, "vllm", version, tensor_parallel_size=2)
    with pytest.raises(UserError, match="contiguous TP groups .* rank order 'strided' is not possible"):
        build(monkeypatch, tmp_path, models, "vllm", version, tensor_parallel_size=2, rank_order="strided")


def test_missing_package_is_a_user_error(monkeypatch, models):
    monkeypatch.setitem(sys.modules, "vllm", None)
    monkeypatch.setitem(sys.modules, "sglang", None)
    with pytest.raises(UserError, match="vllm"):
        VLLMRolloutEngine(str(models[0]), **CONTRACT)
    with pytest.raises(UserError, match="sglang"):
        SGLangRolloutEngine(str(models[0]), **CONTRACT)


# -- generation -----------------------------------------------------------------------------------------
def test_generate_unpads_prompts_and_returns_the_batch_convention(adapter, models):
    package, _, engine, calls = adapter
    out = _gen(engine)
    prompts = calls[-1][1]
    b = make_batch(3, prompt_len=6, resp_len=1, seed=0)
    lens = b["attention_mask"][:, :6].sum(-1).tolist()
    assert [len(p) for p in prompts] == [n for n in lens for _ in range(2)]
    assert torch.equal(out["prompts"], b["input_ids"][:, :6].repeat_interleave(2, 0))
    assert out["responses"].shape == (6, 8) and out["responses"].device.type == "cpu"
    mask = out["response_mask"].bool()
    assert 0 < mask.sum() < mask.numel()
    assert torch.all(out["responses"][~mask] == PAD)
    params = calls[-1][2]
    assert (
        len(params) == 6 and len({p["seed" if package == "vllm" else "sampling_seed"] for p in params}) == 6
    )
    key = "max_tokens" if package == "vllm" else "max_new_tokens"
    assert all(p[key] == 8 and list(p["stop_token_ids"]) == STOPS for p in params)


SETTINGS = [
    dict(temperature=0.7, top_p=1.0, top_k=0),
    dict(temperature=1.0, top_p=0.8, top_k=0),
    dict(temperature=0.7, top_p=1.0, top_k=5),
    dict(temperature=1.0, top_p=1.0, top_k=0, greedy=True),
    dict(temperature=0.7, top_p=1.0, top_k=0, greedy=True),
    # SGLang: top_k <= 1 is greedy (sampling_batch_info.py is_all_greedy): log-probs without temperature
    dict(temperature=0.7, top_p=1.0, top_k=1),
]


@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: "-".join(f"{k}{v}" for k, v in s.items()))
def test_log_probs_are_rlctls_convention_or_absent(adapter, models, settings):
    package, version, engine, _ = adapter
    gap = engine.log_prob_gap(**settings)
    out = _gen(engine, **settings)
    if gap is not None:
        assert "rollout_log_probs" not in out, gap
        return
    mask = out["response_mask"].bool()
    ref = _reference(models[0], out, settings["temperature"])
    assert torch.allclose(ref[mask], out["rollout_log_probs"][mask], atol=1e-5, rtol=0)


@pytest.mark.parametrize(("package", "version"), VERSIONS, ids=IDS)
def test_log_prob_gap_per_engine(package, version, models, monkeypatch, tmp_path):
    engine, _ = build(monkeypatch, tmp_path, models, package, version)
    assert engine.log_prob_gap(temperature=0.7, top_p=1.0, top_k=0) is None
    assert engine.log_prob_gap(temperature=1.0, top_p=1.0, top_k=0, greedy=True) is None
    assert "temperature" in engine.log_prob_gap(temperature=0.6, top_p=1.0, top_k=0, greedy=True)
    if package == "sglang":  # top_k=1 is greedy to SGLang at any temperature
        assert "top_k=1" in engine.log_prob_gap(temperature=0.7, top_p=1.0, top_k=1)
        assert engine.log_prob_gap(temperature=1.0, top_p=1.0, top_k=1) is None
    truncated = engine.log_prob_gap(temperature=1.0, top_p=0.9, top_k=20)
    if package == "vllm":  # processed log-probs are renormalised over the nucleus
        assert "top-k/top-p" in truncated
    else:  # SGLang reports log_softmax(logits / T) before truncation
        assert truncated is None
        monkeypatch.setenv("SGLANG_RETURN_ORIGINAL_LOGPROB", "1")
        assert "RETURN_ORIGINAL_LOGPROB" in engine.log_prob_gap(temperature=0.7, top_p=1.0, top_k=0)


@pytest.mark.parametrize("version", VLLM_VERSIONS)
def test_fake_vllm_truncated_log_probs_differ_from_the_convention(version, models, monkeypatch, tmp_path):
    """Why the adapter drops them: vLLM's processed log-probs under top-p are not log_softmax(logits/T)."""
    engine, _ = build(monkeypatch, tmp_path, models, "vllm", version)
    prompt = [3, 4, 5, 6]
    params = sys.modules["vllm"].SamplingParams(temperature=1.0, top_p=0.5, max_tokens=6, logprobs=0, seed=3)
    (req,) = engine.llm.generate([{"prompt_token_ids": prompt}], params)
    tokens = list(req.outputs[0].token_ids)
    got = torch.tensor([step[t].logprob for step, t in zip(req.outputs[0].logprobs, tokens, strict=True)])
    with torch.no_grad():
        logits = engine.llm.hf.model(input_ids=torch.tensor([prompt + tokens])).logits[0, 3 : 3 + len(tokens)]
    ref = torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(tokens)[:, None]).squeeze(-1)
    assert torch.all(got >= ref - 1e-6) and not torch.allclose(got, ref, atol=1e-4)


@pytest.mark.parametrize(("package", "version"), VERSIONS, ids=IDS)
def test_a_groups_samples_differ_and_reproduce_with_the_seed(package, version, models, monkeypatch, tmp_path):
    extra = {"enable_deterministic_inference": True} if package == "sglang" else {}
    engine, _ = build(monkeypatch, tmp_path, models, package, version, **extra)
    prompt = torch.tensor([[7, 8, 9, 10]])
    kw = dict(n=6, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=6, eos_token_id=None, pad_token_id=PAD)
    first = engine.generate(prompt, torch.ones_like(prompt), seed=11, **kw)["responses"]
    assert len({tuple(r.tolist()) for r in first}) > 1  # a group whose copies agree has zero advantages
    again = engine.generate(prompt, torch.ones_like(prompt), seed=11, **kw)["responses"]
    other = engine.generate(prompt, torch.ones_like(prompt), seed=12, **kw)["responses"]
    assert torch.equal(first, again) and not torch.equal(first, other)


@pytest.mark.parametrize("version", VLLM_VERSIONS)
def test_one_shared_seed_makes_identical_copies(version, models, monkeypatch, tmp_path):
    """The real engines' behaviour the old adapters hit: one SamplingParams seed for every request."""
    engine, _ = build(monkeypatch, tmp_path, models, "vllm", version)
    shared = sys.modules["vllm"].SamplingParams(temperature=1.0, max_tokens=6, seed=5)
    outs = engine.llm.generate([{"prompt_token_ids": [7, 8, 9]}] * 4, shared)
    assert len({tuple(o.outputs[0].token_ids) for o in outs}) == 1


def test_sglang_ignores_the_seed_without_deterministic_inference(models, monkeypatch, tmp_path):
    engine, _ = build(monkeypatch, tmp_path, models, "sglang", SGLANG_VERSIONS[-1])
    prompt = torch.tensor([[7, 8, 9, 10]])
    kw = dict(n=8, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=8, eos_token_id=None, seed=11)
    runs = {
        tuple(engine.generate(prompt, torch.ones_like(prompt), **kw)["responses"].view(-1).tolist())
        for _ in "ab"
    }
    assert len(runs) == 2  # copies differ, but a rerun does not repeat them


@pytest.mark.parametrize(("package", "version"), VERSIONS, ids=IDS)
def test_unknown_sampling_key_raises(package, version, models, monkeypatch, tmp_path):
    engine, _ = build(monkeypatch, tmp_path, models, package, version)
    if package == "vllm":
        with pytest.raises(TypeError, match="^Unexpected keyword argument 'max_new_tokens'"):
            sys.modules["vllm"].SamplingParams(max_new_tokens=4)
    else:
        with pytest.raises(TypeError, match="keyword argument 'max_tokens'"):
            engine.engine.generate(input_ids=[[3, 4]], sampling_params={"max_tokens": 4})


def test_sglang_before_sampling_seed_rejects_it(models, monkeypatch, tmp_path):
    """SGLang 0.5.2 and older have no sampling_seed: the adapter leaves it out rather than fail."""
    surface = load_surface("sglang", "0.5.3")
    surface["SamplingParams"]["fields"].remove("sampling_seed")
    engine, calls = build(monkeypatch, tmp_path, models, "sglang", "0.5.3", surface=surface)
    with pytest.raises(TypeError, match="unexpected keyword argument 'sampling_seed'"):
        engine.engine.generate(input_ids=[[3, 4]], sampling_params={"sampling_seed": 1})
    _gen(engine)
    assert all("sampling_seed" not in p for p in calls[-1][2])


# -- weights and memory ---------------------------------------------------------------------------------
def test_update_weights_in_buckets_then_generation_uses_them(adapter, models):
    package, version, engine, calls = adapter
    new = FSDPTrainEngine(models[1])
    engine.sleep()
    with pytest.raises(RunError, match="asleep"):
        _gen(engine)
    engine.wake()  # the worker's order: wake, then sync the weights
    count = engine.update_weights(new.export_weights("full"))
    assert count == len(list(new.model.parameters()))
    out = _gen(engine)
    mask = out["response_mask"].bool()
    lp = new.compute_log_prob(out, temperature=0.7)["log_probs"]
    assert torch.allclose(lp[mask], out["rollout_log_probs"][mask], atol=1e-5, rtol=0)
    kinds = [c[0] for c in calls]
    if package == "vllm":
        assert kinds.count("collective_rpc") > 1  # several buckets of <= 4 KiB
        assert ("sleep", 1) in calls and ("wake_up", ["kv_cache", "weights"]) in calls
        assert kinds.index("reset_prefix_cache") > max(
            i for i, k in enumerate(kinds) if k == "collective_rpc"
        )
    else:
        updates = [c for c in calls if c[0] == "update_weights_from_tensor"]
        assert len(updates) > 1 and [u[2] for u in updates] == [False] * (len(updates) - 1) + [True]
        regions = load_surface("sglang", version)["memory_regions"]["names"]
        assert ("release_memory_occupation", regions) in calls  # every region, cuda_graph included
        session = "begin_weight_update" in load_surface("sglang", version)["Engine"]["methods"]
        if session:
            first, last = (
                kinds.index("update_weights_from_tensor"),
                len(kinds) - 1 - kinds[::-1].index("update_weights_from_tensor"),
            )
            assert kinds.index("begin_weight_update") < first < last < kinds.index("end_weight_update")
        else:
            assert "begin_weight_update" not in kinds


def test_update_while_asleep_wakes_the_weights_first(adapter, models):
    package, _, engine, calls = adapter
    engine.sleep()
    engine.update_weights(FSDPTrainEngine(models[1]).export_weights("full"))
    engine.wake()
    _gen(engine)
    if package == "vllm":
        assert ("wake_up", ["weights"]) in calls and ("wake_up", ["kv_cache"]) in calls
    else:
        assert ("resume_memory_occupation", ["weights"]) in calls
        rest = sorted(
            set(load_surface("sglang", engine.version.public)["memory_regions"]["names"]) - {"weights"}
        )
        assert ("resume_memory_occupation", rest) in calls
        assert engine.engine.resident() == {"kv_cache", "weights", *rest}


@pytest.mark.parametrize("version", SGLANG_VERSIONS)
def test_sglang_sleep_leaves_no_region_resident(version, models, monkeypatch, tmp_path):
    """SGLang 0.5.23 has a cuda_graph region (constants.py GPU_MEMORY_ALL_TYPES) that a release of
    kv_cache + weights leaves in device memory; the adapter releases every region it has."""
    engine, _ = build(monkeypatch, tmp_path, models, "sglang", version)
    engine.sleep()
    assert engine.engine.resident() == set()
    engine.wake()
    assert engine.engine.resident() == set(load_surface("sglang", version)["memory_regions"]["names"])


def test_sglang_update_outside_a_session_fails_on_the_newest(models, monkeypatch, tmp_path):
    engine, _ = build(monkeypatch, tmp_path, models, "sglang", SGLANG_VERSIONS[-1])
    ok, message = engine.engine.update_weights_from_tensor(named_tensors=[])
    assert ok is False and "begin_weight_update" in message  # the old adapter ignored this
    with pytest.raises(AttributeError):
        build(monkeypatch, tmp_path, models, "sglang", SGLANG_VERSIONS[0])[0].engine.begin_weight_update()


@pytest.mark.parametrize("version", SGLANG_VERSIONS)
def test_sglang_failed_update_raises_and_closes_the_session(version, models, monkeypatch, tmp_path):
    engine, calls = build(monkeypatch, tmp_path, models, "sglang", version)
    monkeypatch.setattr(
        engine.engine, "update_weights_from_tensor", lambda **kw: (False, "Failed to update weights: shape")
    )
    with pytest.raises(RunError, match="update_weights_from_tensor failed: Failed to update weights: shape"):
        engine.update_weights(FSDPTrainEngine(models[1]).export_weights("full"))
    if "begin_weight_update" in load_surface("sglang", version)["Engine"]["methods"]:
        assert [c[0] for c in calls][-2:] == ["begin_weight_update", "end_weight_update"]
        assert engine.engine.session_open is False


def test_sglang_without_cpu_backup_keeps_the_weights_resident(models, monkeypatch, tmp_path):
    """Released weights come back as garbage without a CPU copy; the adapter then releases only the KV cache."""
    surface = load_surface("sglang", "0.5.3")
    surface["ServerArgs"]["fields"].remove("enable_weights_cpu_backup")
    engine, calls = build(monkeypatch, tmp_path, models, "sglang", "0.5.3", surface=surface)
    before = _gen(engine, greedy=True)
    engine.sleep()
    engine.wake()
    assert ("release_memory_occupation", ["kv_cache"]) in calls
    assert torch.equal(_gen(engine, greedy=True)["responses"], before["responses"])
    raw = engine.engine  # what the real library does when asked to release the weights anyway
    raw.release_memory_occupation(tags=["weights"])
    raw.resume_memory_occupation(tags=["weights"])
    assert all(float(p.abs().sum()) == 0 for p in raw.hf.model.parameters())
    with pytest.raises(KeyError):
        raw.resume_memory_occupation(tags=["weights"])


def test_vllm_wake_up_without_tags(models, monkeypatch, tmp_path):
    """vLLM 0.8.2's wake_up() takes no tags: the adapter wakes everything at once there."""
    surface = load_surface("vllm", VLLM_VERSIONS[0])
    surface["LLM"]["methods"]["wake_up"] = {"params": []}
    engine, calls = build(monkeypatch, tmp_path, models, "vllm", VLLM_VERSIONS[0], surface=surface)
    with pytest.raises(TypeError, match=r"^LLM\.wake_up\(\) got an unexpected keyword argument 'tags'"):
        engine.llm.wake_up(tags=["weights"])
    engine.sleep()
    engine.update_weights(FSDPTrainEngine(models[1]).export_weights("full"))
    engine.wake()
    assert ("wake_up", None) in calls and engine.asleep_tags == set()
    _gen(engine)


def test_surfaces_are_small_and_name_their_wheel():
    for package, version in VERSIONS:
        path = load_surface(package, version)
        assert path["version"] == version and path["wheel"].startswith(f"{package}-{version}-")
        assert len(json.dumps(path)) < 40_000


# -- batch helpers --------------------------------------------------------------------------------------
def test_row_seeds_are_distinct_and_stable():
    seeds = row_seeds(7, 64)
    assert len(set(seeds)) == 64 and seeds == row_seeds(7, 64) and seeds != row_seeds(8, 64)
    assert all(0 <= s < 2**31 for s in seeds) and row_seeds(None, 3) == [None] * 3


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
    assert "rollout_log_probs" not in assemble_rollout(
        prompts, pmask, responses, None, n=n, max_new_tokens=max_new, pad_token_id=0
    )


@pytest.mark.parametrize("found", [None, "1", "0"])
def test_vllm_runs_in_process_even_when_multiprocessing_is_exported(found, models, monkeypatch, tmp_path):
    """VLLM_ENABLE_V1_MULTIPROCESSING=1 (vllm 0.33.0 envs.py default) would put the engine core in a
    child process, and collective_rpc would copy each synced weight through host memory
    (v1/serial_utils.py _encode_tensor -> tensor_data: .cpu()); the adapter's old setdefault kept a 1."""
    import os

    if found is None:
        monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    else:
        monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", found)
    build(monkeypatch, tmp_path, models, "vllm", VLLM_VERSIONS[-1])
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"


def test_vllm_install_hint_follows_the_device(monkeypatch):
    from rlctl.engines import vllm_rollout

    assert "vllm-ascend" in vllm_rollout.install_hint("npu")
    monkeypatch.setattr(torch.version, "hip", "7.0.51831", raising=False)
    assert "ROCm build" in vllm_rollout.install_hint(
        "cuda"
    ) and "rlctl[vllm]" not in vllm_rollout.install_hint("cuda")
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    assert vllm_rollout.install_hint("cuda") == "pip install 'rlctl[vllm]'"
