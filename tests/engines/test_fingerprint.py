"""Weight fingerprints: both sides agree after a good sync and name the tensor a bad one missed.

The rollout side runs on the real HF engine, on the vLLM adapter through ``collective_rpc`` into
the worker extension over a fake model in vLLM's merged/padded layout, and on FSDP2 shards over
gloo with two ranks (partial sums all-reduced) against the full tensors.
"""

from __future__ import annotations

import os
import types

import pytest
import torch

from rlctl.dispatch.local_ranks import spawn_ranks
from rlctl.engines.fingerprint import checksum, fingerprint_params, same, sample_plan
from rlctl.engines.hf_rollout import HFRolloutEngine
from rlctl.engines.sglang_rollout import SGLangRolloutEngine
from rlctl.engines.vllm_rollout import VLLMRolloutEngine, vllm_view
from rlctl.trainer.state.fingerprint import SyncCheck
from tests.engines.fakes import SGLANG_VERSIONS, VLLM_VERSIONS, install
from tests.engines.helpers import free_port, make_model

torch.set_num_threads(1)
CONTRACT = dict(device="cuda", dtype="float32", trust_remote_code=False)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model(tmp_path_factory.mktemp("fp") / "m", seed=1)


def _trained(model_dir, dtype=torch.float32) -> dict[str, torch.Tensor]:
    """The trainer's weights after an 'update': every tensor moved (fp32 masters)."""
    from rlctl.engines.hf_model import load_causal_lm

    model = load_causal_lm(model_dir, dtype="float32")
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 1e-3)
    return {n: p.detach().to(dtype) for n, p in model.named_parameters()}


def _spec(weights):
    return [(n, tuple(t.shape)) for n, t in weights.items()]


def _differs(trainer, rollout):
    return [n for n in trainer if rollout[n] is None or not same(trainer[n], rollout[n])]


def test_one_sampled_element_off_by_one_bf16_step_is_seen():
    master = torch.randn(96, 40, generator=torch.Generator().manual_seed(0))
    copy = master.to(torch.bfloat16)
    assert checksum("w", master, torch.bfloat16) == checksum("w", copy)  # exact, not close
    pos, _ = sample_plan("w", (96, 40))
    flat = copy.reshape(-1).clone()
    i = int(pos[7])
    flat[i : i + 1].view(torch.int16).add_(1)  # the next bf16 value
    assert flat[i] != copy.reshape(-1)[i]
    assert not same(checksum("w", master, torch.bfloat16), checksum("w", flat.view(96, 40)))
    # the plan depends on the name: a swap of two same-shaped tensors shows
    assert checksum("a", master) != checksum("b", master)


@pytest.mark.parametrize("rollout_dtype", ["float32", "bfloat16"])
def test_hf_engine_agrees_after_sync_and_names_the_skipped_tensor(model_dir, rollout_dtype):
    engine = HFRolloutEngine(model_dir, dtype=rollout_dtype)
    trainer = _trained(model_dir)
    dtype = getattr(torch, rollout_dtype)
    skip = "model.layers.1.mlp.up_proj.weight"
    engine.update_weights((n, t) for n, t in trainer.items() if n != skip)
    got = engine.weight_fingerprint(_spec(trainer))
    assert all(v is not None and v[2] == rollout_dtype for v in got.values())
    ours = fingerprint_params(trainer.items(), {n: dtype for n in trainer})
    assert _differs(ours, got) == [skip]
    engine.update_weights([(skip, trainer[skip])])
    assert _differs(ours, engine.weight_fingerprint(_spec(trainer))) == []


@pytest.mark.parametrize("version", VLLM_VERSIONS)
def test_vllm_fingerprint_reads_the_merged_layout_through_collective_rpc(
    model_dir, monkeypatch, tmp_path, version
):
    calls: list = []
    install(monkeypatch, tmp_path, "vllm", version, calls)
    engine = VLLMRolloutEngine(str(model_dir), bucket_bytes=4096, **CONTRACT)
    vllm_names = dict(engine.llm.worker.model_runner.model.named_parameters())
    assert "model.layers.0.self_attn.qkv_proj.weight" in vllm_names
    assert "model.layers.0.self_attn.k_proj.weight" not in vllm_names
    trainer = _trained(model_dir)
    skip = "model.layers.0.self_attn.k_proj.weight"  # the middle of a merged tensor
    engine.update_weights((n, t) for n, t in trainer.items() if n != skip)
    got = engine.weight_fingerprint(_spec(trainer))
    assert ("collective_rpc", "rlctl_weight_fingerprint", len(trainer)) in calls
    assert all(v is not None for v in got.values()), [n for n, v in got.items() if v is None]
    assert _differs(fingerprint_params(trainer.items()), got) == [skip]


def test_vllm_view_maps_stacked_and_padded_parameters():
    q, k, v = torch.randn(8, 4), torch.randn(4, 4), torch.randn(4, 4)
    emb = torch.randn(70, 4)
    padded = torch.cat([emb, torch.zeros(58, 4)])
    params = {"m.l.attn.qkv_proj.weight": torch.cat([q, k, v]), "m.embed_tokens.weight": padded}
    model = types.SimpleNamespace(
        packed_modules_mapping={"qkv_proj": ["q_proj", "k_proj", "v_proj"]},
        get_submodule=lambda path: types.SimpleNamespace(output_sizes=[8, 4, 4]),
    )
    assert torch.equal(vllm_view(model, params, "m.l.attn.v_proj.weight", (4, 4)), v)
    assert torch.equal(vllm_view(model, params, "m.l.attn.q_proj.weight", (8, 4)), q)
    assert torch.equal(vllm_view(model, params, "m.embed_tokens.weight", (70, 4)), emb)
    assert vllm_view(model, params, "m.l.mlp.down_proj.weight", (4, 4)) is None  # not in the model


@pytest.mark.parametrize("version", SGLANG_VERSIONS[:1])
def test_sglang_reports_not_available_never_ok(model_dir, monkeypatch, tmp_path, version):
    install(monkeypatch, tmp_path, "sglang", version, [])
    engine = SGLangRolloutEngine(str(model_dir), bucket_bytes=4096, **CONTRACT)
    from rlctl.engines.hf_model import load_causal_lm

    check = SyncCheck()
    metrics = check.after_sync(load_causal_lm(model_dir), engine, device="cpu")
    assert metrics["sync/fingerprint_ok"] == -1.0 and check.warned
    assert metrics["sync/weight_version"] == 1.0


def _odd_model(path):
    """A Qwen2 whose row counts (67 vocab, 45 intermediate) split unevenly over 2 ranks."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(3)
    cfg = Qwen2Config(
        vocab_size=67,
        hidden_size=24,
        intermediate_size=45,
        num_hidden_layers=1,
        num_attention_heads=3,
        num_key_value_heads=1,
        max_position_embeddings=32,
    )
    Qwen2ForCausalLM(cfg).save_pretrained(path)
    return path


def _sharded_worker(rank: int, world: int, port: int, model_dir: str, out: str) -> None:
    import torch.distributed as dist

    from rlctl.engines.fsdp_train import FSDPTrainEngine

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        engine = FSDPTrainEngine(model_dir)
        shards = list(engine.model.named_parameters())
        assert all(hasattr(p, "to_local") for _, p in shards)
        dtypes = {n: torch.bfloat16 for n, _ in shards}
        sharded = fingerprint_params(shards, dtypes, device="cpu")
        full = {n: checksum(n, t, torch.bfloat16) for n, t in engine.export_weights("full")}
        if rank == 0:
            torch.save({"sharded": sharded, "full": full}, out)
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(180)
def test_fsdp_shards_fingerprint_like_the_full_tensors(tmp_path):
    model_dir = _odd_model(tmp_path / "odd")
    out = tmp_path / "fp.pt"
    spawn_ranks(_sharded_worker, 2, (2, free_port(), str(model_dir), str(out)))
    result = torch.load(out)
    assert set(result["sharded"]) == set(result["full"])
    assert [n for n in result["full"] if not same(result["sharded"][n], result["full"][n])] == []


def _extension_over(arch: str, params: dict[str, torch.Tensor]):
    """The worker extension over a vLLM model of class ``arch`` holding ``params``."""
    from rlctl.engines.vllm_rollout import RlctlWorkerExtension

    model = type(arch, (), {"named_parameters": lambda self, remove_duplicate=True: iter(params.items())})()
    ext = RlctlWorkerExtension.__new__(RlctlWorkerExtension)
    ext.model_runner = types.SimpleNamespace(model=model)
    return ext


@pytest.mark.parametrize(
    "arch",
    ["GPT2LMHeadModel", "BloomForCausalLM", "FalconForCausalLM", "GPTNeoXForCausalLM", "NewArchForCausalLM"],
)
def test_vllm_layouts_rlctl_cannot_read_are_not_available_never_a_failure(arch):
    """GPT-2: vLLM stores Conv1D weights transposed under the same name and (square) shape
    (vllm 0.33.0 models/gpt2.py _transpose_conv1d); Bloom/Falcon/GPT-NeoX reorder query_key_value
    in place. Reading them as HF tensors would call a correct sync wrong: they are None."""
    hf = torch.randn(16, 16)
    name = "transformer.h.0.attn.c_proj.weight"
    trainer = fingerprint_params([(name, hf)])
    got = _extension_over(arch, {name: hf.t().contiguous()}).rlctl_weight_fingerprint([(name, (16, 16))])
    assert got == {name: None}
    assert not same(trainer[name], checksum(name, hf.t().contiguous()))  # what reading it would say


def test_vllm_known_layout_is_read():
    w = torch.randn(16, 16)
    name = "model.layers.0.mlp.down_proj.weight"
    got = _extension_over("Qwen2ForCausalLM", {name: w}).rlctl_weight_fingerprint([(name, (16, 16))])
    assert same(fingerprint_params([(name, w)])[name], got[name])


class CUDAGraphWrapper:
    """vllm 0.13.0 ``compilation/cuda_graph.py``: not a module; forwards attributes to ``runnable``
    (``__getattr__``); ``unwrap()`` returns it. ``GPUModelRunner.model`` is one under the default
    compilation mode and ``GPUModelRunner.get_model()`` unwraps it (``v1/worker/gpu_model_runner.py``)."""

    def __init__(self, runnable):
        self.runnable = runnable

    def __getattr__(self, key):
        return getattr(self.runnable, key)

    def unwrap(self):
        return self.runnable


def test_vllm_fingerprint_reads_the_model_under_vllm_0_13s_cuda_graph_wrapper():
    """The wrapper's class name is not a model class: read through it, the fingerprint would say
    'not available' for every tensor of a layout rlctl knows. The runner's get_model() unwraps it."""
    w = torch.randn(16, 16)
    name = "model.layers.0.mlp.down_proj.weight"
    ext = _extension_over("Qwen2ForCausalLM", {name: w})
    model = ext.model_runner.model
    wrapped = CUDAGraphWrapper(model)
    ext.model_runner = types.SimpleNamespace(model=wrapped, get_model=lambda: wrapped.unwrap())
    got = ext.rlctl_weight_fingerprint([(name, (16, 16))])
    assert got[name] is not None and same(fingerprint_params([(name, w)])[name], got[name])
