"""Engine registry: built-ins, fallback order, unknown keys, entry-point plugins."""

from __future__ import annotations

import sys
import textwrap

import pytest

from rlctl.engines import registry
from rlctl.engines.registry import get_engine, register_engine, registered
from rlctl.errors import UserError


@pytest.fixture
def clean_registry(monkeypatch):
    """Work on a copy of the registry so test registrations do not leak."""
    registry._load_plugins()
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    return registry._REGISTRY


def test_builtins_resolve_for_any_model_and_device():
    from rlctl.engines.fsdp_train import FSDPTrainEngine
    from rlctl.engines.hf_rollout import HFRolloutEngine

    assert get_engine("train", "qwen2", "fsdp2", "cpu") is FSDPTrainEngine
    assert get_engine("train", "llama", "fsdp2", "cuda", vendor="amd") is FSDPTrainEngine
    assert get_engine("rollout", "qwen2", "hf", "npu") is HFRolloutEngine


def test_fallback_prefers_vendor_then_device_then_generic(clean_registry):
    def make(name):
        return type(name, (), {})

    generic = register_engine("rollout", "*", "toy", "*")(make("Generic"))
    qwen_any = register_engine("rollout", "qwen2", "toy", "*")(make("QwenAny"))
    cuda = register_engine("rollout", "*", "toy", "cuda")(make("Cuda"))
    qwen_cuda = register_engine("rollout", "qwen2", "toy", "cuda")(make("QwenCuda"))
    amd = register_engine("rollout", "*", "toy", "cuda", vendor="amd")(make("Amd"))

    assert get_engine("rollout", "qwen2", "toy", "cuda", vendor="amd") is amd
    assert get_engine("rollout", "qwen2", "toy", "cuda", vendor="nvidia") is qwen_cuda
    assert get_engine("rollout", "llama", "toy", "cuda") is cuda
    assert get_engine("rollout", "qwen2", "toy", "cpu") is qwen_any
    assert get_engine("rollout", "llama", "toy", "cpu") is generic
    assert get_engine("rollout", "llama", "toy", "cpu", vendor="amd") is generic


def test_unknown_key_lists_what_is_registered(clean_registry):
    with pytest.raises(UserError) as err:
        get_engine("rollout", "qwen2", "tensorrt", "cuda")
    msg = str(err.value)
    assert "backend='tensorrt'" in msg and "rollout:hf(model_type=*, device=*)" in msg
    with pytest.raises(ValueError):
        register_engine("serve")


def test_entry_point_plugins_register(tmp_path, monkeypatch, clean_registry):
    pkg = tmp_path / "toy_engine_plugin.py"
    pkg.write_text(
        textwrap.dedent(
            """
            from rlctl.engines.registry import register_engine

            def register():
                @register_engine("train", "*", "megatron", "*")
                class MegatronEngine:
                    pass
            """
        )
    )
    dist_info = tmp_path / "toy_engine_plugin-0.1.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-engine-plugin\nVersion: 0.1\n")
    (dist_info / "entry_points.txt").write_text("[rlctl.engines]\nmegatron = toy_engine_plugin:register\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_loaded", False)
    try:
        engine = get_engine("train", "qwen2", "megatron", "cuda")
        assert engine.__name__ == "MegatronEngine"
        assert any(k.backend == "megatron" for k in registered("train"))
    finally:
        sys.modules.pop("toy_engine_plugin", None)
