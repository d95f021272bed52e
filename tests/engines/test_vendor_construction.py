"""The engine construction ``rlctl train`` performs, on the simulated vendor hosts: the platform's
engine settings and ``rollout.engine_kwargs`` -> ``build_specs`` -> the worker's
``rollout_engine(spec)`` -> the fake vLLM / SGLang of the installed release (built from the
recorded surfaces), whose config class rejects any keyword the release lacks."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlctl.engines.engine_fields import resolve_engine_kwargs
from rlctl.platforms.ascend import AscendPlatform
from rlctl.platforms.nvidia import NvidiaPlatform
from rlctl.platforms.rocm import RocmPlatform
from rlctl.profile.loader import load_profile
from rlctl.trainer.plan.specs import build_specs
from rlctl.trainer.workers.roles import rollout_engine
from tests.engines.fakes import install
from tests.engines.helpers import make_model
from tests.platforms.vendor_hosts import ascend_910b, b200_sglang, h100, mi300x


def _hardware(platform) -> dict:
    """The fake engine's kernel asserts for this platform's devices."""
    if platform.name == "rocm":
        return {"rocm": True}
    if platform.name == "ascend":
        return {"ascend": True}
    cc = platform.compute_capability() if platform.name == "nvidia" else None
    return {"device_capability": cc} if cc else {}


def _build(platform, engine: str, version: str, tmp_path: Path, monkeypatch, body: str = "", actor=None):
    """Build the rollout engine as a policy worker does; (the engine, the keywords it got)."""
    model = make_model(tmp_path / "model", seed=1)
    profile_path = tmp_path / "p.toml"
    profile_path.write_text(f'[model]\npath = "{model}"\n[rollout]\nengine = "{engine}"\n{body}\n')
    profile = load_profile(profile_path)
    kwargs = resolve_engine_kwargs(
        platform, engine, profile.rollout.engine_kwargs, where=f"{profile.source}: rollout.engine_kwargs"
    )
    specs = build_specs(
        profile,
        device_type=platform.device_type,
        dtype="float32",
        attn=platform.attention_impl(),
        dist_backend=platform.dist_backend,
        rollout_engine=engine,
        vendor=platform.name,
        rollout_engine_kwargs=kwargs,
    )
    calls: list = []
    install(monkeypatch, tmp_path, engine, version, calls, **_hardware(platform))
    built = rollout_engine(specs.policy, actor)
    return built, calls[0][1]


def _construct(platform, engine: str, version: str, tmp_path: Path, monkeypatch, body: str = ""):
    """The keywords the engine got when built as a policy worker builds it."""
    return _build(platform, engine, version, tmp_path, monkeypatch, body)[1]


def test_mi300x_vllm_gets_no_flash_attn(tmp_path, monkeypatch):
    """ROCm flash-attn installed: transformers takes flash_attention_2, vLLM keeps its own backend."""
    p = RocmPlatform(mi300x(tmp_path))
    assert p.attention_impl() == "flash_attention_2"
    got = _construct(p, "vllm", "0.33.0", tmp_path, monkeypatch)
    assert "attention_config" not in got and "attn_implementation" not in got


def test_b200_sglang_gets_no_fa3(tmp_path, monkeypatch):
    p = NvidiaPlatform(b200_sglang(tmp_path))
    got = _construct(p, "sglang", "0.5.23", tmp_path, monkeypatch)
    assert "attention_backend" not in got


def test_rocm_sglang_gets_triton(tmp_path, monkeypatch):
    got = _construct(RocmPlatform(mi300x(tmp_path)), "sglang", "0.5.23", tmp_path, monkeypatch)
    assert got["attention_backend"] == "triton"


def test_ascend_vllm_runs_eager(tmp_path, monkeypatch):
    got = _construct(AscendPlatform(ascend_910b(tmp_path)), "vllm", "0.23.0", tmp_path, monkeypatch)
    assert got["enforce_eager"] is True


def _worker_env(platform, monkeypatch) -> None:
    """The worker process's environment: the run plan's env (``platform.rollout_env()``) as the
    in-process backend puts it into ``os.environ`` and Ray into each actor's ``runtime_env``."""
    monkeypatch.delenv("VLLM_ASCEND_ENABLE_NZ", raising=False)
    for key, value in platform.rollout_env().items():
        monkeypatch.setenv(key, value)


def test_ascend_vllm_survives_a_whole_sync_cycle(tmp_path, monkeypatch):
    """sleep -> load new weights -> wake -> generate on vllm-ascend 0.23.0.post1, whose wake_up
    raises unless the weight NZ mode is 0 (its default is 1): the platform's env turns it off."""
    import torch

    platform = AscendPlatform(ascend_910b(tmp_path))
    _worker_env(platform, monkeypatch)
    engine, _ = _build(platform, "vllm", "0.23.0", tmp_path, monkeypatch)
    hf = engine.llm.hf.model
    new = {name: torch.full_like(t, 0.01) for name, t in hf.state_dict().items()}
    engine.sleep()
    engine.update_weights(iter(new.items()))
    engine.wake()
    assert torch.equal(hf.state_dict()["model.embed_tokens.weight"], new["model.embed_tokens.weight"])
    out = engine.generate(
        torch.tensor([[1, 2, 3]]), torch.ones(1, 3, dtype=torch.long), max_new_tokens=2, seed=0
    )
    assert out["responses"].shape[0] == 1


@pytest.mark.parametrize(
    "env, body, what",
    [
        ({"VLLM_ASCEND_ENABLE_NZ": "1"}, "", "VLLM_ASCEND_ENABLE_NZ = 1"),
        ({}, "engine_kwargs = { additional_config = { weight_nz_mode = 2 } }", "weight_nz_mode = 2"),
    ],
)
def test_ascend_nz_left_on_is_refused_before_start(tmp_path, monkeypatch, env, body, what):
    """A user's NZ mode that would make the first wake raise is one line at resolution, exit 2."""
    from rlctl.errors import UserError

    platform = AscendPlatform(ascend_910b(tmp_path))
    platform.host.env.update(env)
    with pytest.raises(UserError, match=what + ".*wake_up raises"):
        _build(platform, "vllm", "0.23.0", tmp_path, monkeypatch, body)


def test_the_fake_ascend_wake_up_raises_as_released(tmp_path, monkeypatch):
    """Without the platform's env the fake engine dies at its first wake, as vllm-ascend does."""
    monkeypatch.delenv("VLLM_ASCEND_ENABLE_NZ", raising=False)
    import sys

    from tests.engines.helpers import make_model

    install(monkeypatch, tmp_path, "vllm", "0.23.0", [], ascend=True)
    from rlctl.engines.vllm_rollout import EXTENSION

    model = str(make_model(tmp_path / "m", seed=1))
    llm = sys.modules["vllm"].LLM(model=model, enable_sleep_mode=True, worker_extension_cls=EXTENSION)
    llm.sleep(level=1)
    with pytest.raises(ValueError, match="FRACTAL_NZ mode is enabled"):
        llm.wake_up(tags=["weights"])


@pytest.mark.parametrize("driver", ["570.172.08", "580.82.07"])
def test_h100_profile_engine_kwargs_reach_vllm(tmp_path, monkeypatch, driver):
    p = NvidiaPlatform(h100(tmp_path, driver))
    got = _construct(p, "vllm", "0.33.0", tmp_path, monkeypatch, "engine_kwargs = { max_model_len = 4096 }")
    assert got["max_model_len"] == 4096 and "attention_config" not in got


def test_the_old_mapping_dies_in_the_fakes_kernel_asserts(tmp_path, monkeypatch):
    """What the old adapters passed (flash_attention_2 -> FLASH_ATTN / fa3) on these hosts fails
    where the real engines fail: vLLM's first forward on ROCm, SGLang's backend creation on SM 10."""
    import sys

    from tests.engines.helpers import make_model

    model = str(make_model(tmp_path / "m", seed=1))
    install(monkeypatch, tmp_path, "vllm", "0.33.0", [], rocm=True)
    with pytest.raises(AssertionError, match="FlashAttention version not detected"):
        sys.modules["vllm"].LLM(model=model, attention_config={"backend": "FLASH_ATTN"})
    install(monkeypatch, tmp_path, "sglang", "0.5.23", [], device_capability=(10, 0))
    with pytest.raises(AssertionError, match="requires SM>=80 and SM<=90"):
        sys.modules["sglang"].Engine(model_path=model, attention_backend="fa3")


@pytest.mark.parametrize("engine, version", [("vllm", "0.33.0"), ("sglang", "0.5.23")])
def test_a_lora_actor_builds_the_engine_with_its_lora_api(tmp_path, monkeypatch, engine, version):
    """With [actor.lora] the engine gets its LoRA switched on (adapter-only sync) and loads its own
    base, even beside a colocated actor whose frozen base an HF engine would share."""
    import types

    import torch

    platform = NvidiaPlatform(h100(tmp_path, "580.82.07"))
    actor = types.SimpleNamespace(model=torch.nn.Linear(2, 2).requires_grad_(False))  # shareable base
    built, given = _build(platform, engine, version, tmp_path, monkeypatch, "[actor.lora]\nrank = 16\n", actor)
    assert given["enable_lora"] is True and given["max_lora_rank"] == 16
    assert built.adapter_sync and built.lora.rank == 16
