"""Adapter-only LoRA sync into vLLM through its own API (``LoRARequest`` + ``LLM.llm_engine.add_lora``),
against fakes built from the recorded surfaces of the released wheels; merged sync where a version
lacks the API, said by doctor."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlctl.engines.vllm_rollout import VLLMRolloutEngine
from tests.engines.fakes import install, load_surface
from tests.engines.helpers import make_model

CONTRACT = dict(device="cuda", dtype="float32", trust_remote_code=False, bucket_bytes=4096)
VERSIONS = ["0.10.2", "0.33.0"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from rlctl.engines.fsdp_train import FSDPTrainEngine
    from rlctl.engines.lora import LoraSpec

    model_dir = make_model(tmp_path_factory.mktemp("vllm_lora") / "m", tie=True, seed=2)
    spec = LoraSpec(rank=4, alpha=8.0, seed=3)
    engine = FSDPTrainEngine(model_dir, lora=spec)
    return model_dir, spec, engine


def _train_step(engine, seed: int) -> None:
    """A trained-looking adapter: new B values (and A nudged), as an optimiser step leaves them."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in engine.model.named_parameters():
            if ".lora_B." in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)
            elif ".lora_A." in name:
                p.add_(torch.randn(p.shape, generator=g) * 0.01)


def _merged_engine(model_dir, spec, actor):
    from rlctl.engines.hf_rollout import HFRolloutEngine
    from rlctl.trainer.workers.weight_streams import merged_stream

    plain = HFRolloutEngine(model_dir)
    plain.update_weights(merged_stream(actor, spec, {}))
    return plain


@pytest.mark.parametrize("version", VERSIONS)
def test_each_sync_is_a_new_adapter_that_generate_uses(trained, monkeypatch, tmp_path, version):
    from rlctl.trainer.workers.weight_streams import ByteCount, model_bytes

    model_dir, spec, actor = trained
    calls: list = []
    install(monkeypatch, tmp_path, "vllm", version, calls)
    assert VLLMRolloutEngine.adapter_sync  # the class: this version has the API
    engine = VLLMRolloutEngine(str(model_dir), lora=spec, **CONTRACT)
    llm_kwargs = next(c[1] for c in calls if c[0] == "LLM")
    assert (llm_kwargs["enable_lora"], llm_kwargs["max_lora_rank"], llm_kwargs["max_loras"]) == (True, 8, 1)
    assert engine.adapter_sync

    dirs = []
    for step in (1, 2):
        _train_step(actor, seed=step)
        sent = ByteCount()
        engine.update_weights(sent(actor.export_adapter()))
        adapter_bytes = sum(p.numel() * p.element_size() for n, p in actor.model.named_parameters() if ".lora_" in n)
        assert sent.bytes == adapter_bytes < 0.2 * model_bytes(actor.model)  # the adapter's bytes alone
        assert not any(c[0] == "collective_rpc" and c[1] == "rlctl_load_weights" for c in calls)  # no base resent
        dirs.append(Path(engine.adapter.request.lora_path))
        assert engine.llm.llm_engine.list_loras() == {step}  # only the newest is held

    assert ("remove_lora", 1) in calls and calls.index(("remove_lora", 1)) < [c[:2] for c in calls].index(("add_lora", 2))
    assert not dirs[0].exists() and (dirs[1] / "adapter_model.safetensors").is_file()

    # generate() and the canary's prompt log-probs go through the newest adapter, and compute
    # what the trainer's merged model computes
    tokens = [3, 7, 1, 9, 4, 2, 8]
    ours = engine.prompt_log_probs(tokens)
    assert [c for c in calls if c[0] == "lora_request"][-1][:2] == ("lora_request", 2)
    merged = _merged_engine(model_dir, spec, actor)
    with torch.no_grad():
        logits = merged.model(input_ids=torch.tensor([tokens])).logits[0, :-1].float()
    want = torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens[1:])[:, None])[:, 0]
    assert torch.allclose(ours.float(), want, atol=1e-4)
    engine.adapter.request = None  # without the request vLLM computes with the base: it differs
    assert not torch.allclose(engine.prompt_log_probs(tokens).float(), want, atol=1e-3)


def test_fingerprint_reads_the_base_and_reports_the_adapter_unavailable(trained, monkeypatch, tmp_path):
    from rlctl.trainer.state.fingerprint import SyncCheck

    model_dir, spec, actor = trained
    install(monkeypatch, tmp_path, "vllm", "0.33.0", [])
    engine = VLLMRolloutEngine(str(model_dir), lora=spec, **CONTRACT)
    engine.update_weights(actor.export_adapter())
    spec_names = [(n, tuple(p.shape)) for n, p in actor.model.named_parameters()]
    theirs = engine.weight_fingerprint(spec_names)
    base = [n for n, _ in spec_names if n.endswith(".base_layer.weight")]
    assert base and all(theirs[n] is not None for n in base)  # read from vLLM's fused layout
    assert all(theirs[n] is None for n, _ in spec_names if ".lora_" in n)  # not readable: -1, not a failure
    out = SyncCheck().after_sync(actor.model, engine, device="cpu")
    assert out["sync/fingerprint_ok"] == -1.0


def test_modules_to_save_load_into_the_base_and_stay_out_of_the_adapter_config(monkeypatch, tmp_path):
    import json

    from rlctl.engines.fsdp_train import FSDPTrainEngine
    from rlctl.engines.lora import LoraSpec

    model_dir = make_model(tmp_path / "m", tie=False, seed=4)
    spec = LoraSpec(rank=8, alpha=16.0, seed=1, modules_to_save=("lm_head",))
    actor = FSDPTrainEngine(model_dir, lora=spec)
    _train_step(actor, seed=5)
    with torch.no_grad():
        for name, p in actor.model.named_parameters():
            if ".modules_to_save." in name:
                p.add_(0.05)
    calls: list = []
    install(monkeypatch, tmp_path, "vllm", "0.33.0", calls)
    engine = VLLMRolloutEngine(str(model_dir), lora=spec, **CONTRACT)
    engine.update_weights(actor.export_adapter())  # vLLM would refuse modules_to_save in the config
    config = json.loads((Path(engine.adapter.request.lora_path) / "adapter_config.json").read_text())
    assert not config.get("modules_to_save")
    assert ("collective_rpc", "rlctl_load_weights", 1) in calls  # lm_head, in place, under its own name
    tokens = [5, 1, 6, 2, 9, 3]
    want_engine = _merged_engine(model_dir, spec, actor)
    with torch.no_grad():
        logits = want_engine.model(input_ids=torch.tensor([tokens])).logits[0, :-1].float()
    want = torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens[1:])[:, None])[:, 0]
    assert torch.allclose(engine.prompt_log_probs(tokens).float(), want, atol=1e-4)


def test_a_version_without_the_api_gets_merged_sync_and_doctor_says_so(trained, monkeypatch, tmp_path):
    from rlctl.doctor.checks_lora import check_lora_sync
    from rlctl.platforms.nvidia import NvidiaPlatform
    from rlctl.verdict import Verdict
    from tests.platforms.fakes import nvidia_host

    surface = load_surface("vllm", "0.10.2")
    surface["LLMEngine"] = None  # no add_lora / remove_lora / list_loras
    install(monkeypatch, tmp_path, "vllm", "0.10.2", [], surface)
    assert VLLMRolloutEngine.adapter_sync is False
    assert "vllm.v1.engine.llm_engine" in VLLMRolloutEngine.adapter_sync_gap()
    platform = NvidiaPlatform(nvidia_host(tmp_path))
    monkeypatch.setattr(platform, "rollout_engine", lambda: "vllm")
    row = check_lora_sync(platform)
    assert row.verdict is Verdict.WARN and row.reason.startswith("vllm: merged-weight sync")
    assert "vllm 0.10.2" in row.reason and "llm_engine" in row.reason
    # built without lora (rollout_engines.py passes it only where adapter_sync is true), an engine
    # takes merged weights (roles.sync_weights reads the engine's adapter_sync)
    model_dir, _, _ = trained
    engine = VLLMRolloutEngine(str(model_dir), **CONTRACT)
    assert engine.adapter_sync is False and engine.adapter is None
    with pytest.raises(Exception, match="cannot hold a LoRA adapter"):
        VLLMRolloutEngine(str(model_dir), lora=trained[1], **CONTRACT)


def test_doctor_names_adapter_only_sync_where_the_api_is(monkeypatch, tmp_path):
    from rlctl.doctor.checks_lora import check_lora_sync
    from rlctl.platforms.nvidia import NvidiaPlatform
    from rlctl.verdict import Verdict
    from tests.platforms.fakes import nvidia_host

    install(monkeypatch, tmp_path, "vllm", "0.33.0", [])
    platform = NvidiaPlatform(nvidia_host(tmp_path))
    monkeypatch.setattr(platform, "rollout_engine", lambda: "vllm")
    row = check_lora_sync(platform)
    assert row.verdict is Verdict.PASS and row.reason.startswith("vllm: adapter-only sync"), row.reason
