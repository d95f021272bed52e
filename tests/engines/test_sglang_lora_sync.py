"""Adapter-only LoRA sync into SGLang through its own API (``Engine.load_lora_adapter`` /
``unload_lora_adapter``, ``generate(lora_path=)``), against fakes built from the recorded surfaces
of the released wheels; merged sync where a version lacks the API, said by doctor."""

from __future__ import annotations

import pytest
import torch

from rlctl.engines.sglang_rollout import SGLangRolloutEngine
from tests.engines.fakes import install, load_surface
from tests.engines.helpers import make_model
from tests.engines.test_vllm_lora_sync import _merged_engine, _train_step

CONTRACT = dict(device="cuda", dtype="float32", trust_remote_code=False, bucket_bytes=4096)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from rlctl.engines.fsdp_train import FSDPTrainEngine
    from rlctl.engines.lora import LoraSpec

    model_dir = make_model(tmp_path_factory.mktemp("sglang_lora") / "m", tie=True, seed=2)
    spec = LoraSpec(rank=4, alpha=8.0, seed=3)
    return model_dir, spec, FSDPTrainEngine(model_dir, lora=spec)


def _want(model_dir, spec, actor, tokens):
    merged = _merged_engine(model_dir, spec, actor)
    with torch.no_grad():
        logits = merged.model(input_ids=torch.tensor([tokens])).logits[0, :-1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens[1:])[:, None])[:, 0]


@pytest.mark.parametrize("version", ["0.5.3", "0.5.23"])
def test_each_sync_loads_a_new_adapter_that_generate_names(trained, monkeypatch, tmp_path, version):
    from rlctl.trainer.workers.weight_streams import ByteCount, model_bytes

    model_dir, spec, actor = trained
    calls: list = []
    install(monkeypatch, tmp_path, "sglang", version, calls)
    assert SGLangRolloutEngine.adapter_sync
    engine = SGLangRolloutEngine(str(model_dir), lora=spec, **CONTRACT)
    server = next(c[1] for c in calls if c[0] == "Engine")
    assert (server["enable_lora"], server["max_lora_rank"], server["lora_target_modules"]) == (True, 4, ["all"])
    assert server["max_loras_per_batch"] == 1
    for step in (1, 2):
        _train_step(actor, seed=10 + step)
        sent = ByteCount()
        engine.update_weights(sent(actor.export_adapter()))
        assert 0 < sent.bytes < 0.2 * model_bytes(actor.model)
        assert not any(c[0] == "update_weights_from_tensor" for c in calls)  # no base resent
    assert engine.engine.loras.names.keys() == {"rlctl-v2"}  # the previous one unloaded
    assert ("unload_lora_adapter", "rlctl-v1") in calls
    tokens = [3, 7, 1, 9, 4, 2, 8]
    ours = engine.prompt_log_probs(tokens)
    assert [c for c in calls if c[0] == "lora_path"][-1] == ("lora_path", ["rlctl-v2"])
    assert torch.allclose(ours.float(), _want(model_dir, spec, actor, tokens), atol=1e-4)


def test_a_version_without_the_api_gets_merged_sync_and_doctor_says_so(trained, monkeypatch, tmp_path):
    from rlctl.doctor.checks_lora import check_lora_sync
    from rlctl.platforms.nvidia import NvidiaPlatform
    from rlctl.verdict import Verdict
    from tests.platforms.fakes import nvidia_host

    surface = load_surface("sglang", "0.5.3")
    for name in ("load_lora_adapter", "unload_lora_adapter"):
        surface["Engine"]["methods"].pop(name)
    install(monkeypatch, tmp_path, "sglang", "0.5.3", [], surface)
    assert SGLangRolloutEngine.adapter_sync is False
    assert "load_lora_adapter" in SGLangRolloutEngine.adapter_sync_gap()
    platform = NvidiaPlatform(nvidia_host(tmp_path))
    monkeypatch.setattr(platform, "rollout_engine", lambda: "sglang")
    row = check_lora_sync(platform)
    assert row.verdict is Verdict.WARN and "sglang 0.5.3" in row.reason and "load_lora_adapter" in row.reason
    engine = SGLangRolloutEngine(str(trained[0]), **CONTRACT)
    assert engine.adapter_sync is False and engine.adapter is None
