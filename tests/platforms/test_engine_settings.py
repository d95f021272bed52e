"""Per-vendor engine settings: each vendor plugin says what kernel each engine runs, on the
issue's simulated hosts, and the engine keywords of a run are checked before any worker starts."""

from __future__ import annotations

import re

import pytest

from rlctl.engines.engine_fields import installed_fields, resolve_engine_kwargs
from rlctl.engines.registry import runs_on
from rlctl.errors import UserError
from rlctl.platforms import BUILTINS
from rlctl.platforms.ascend import AscendPlatform
from rlctl.platforms.host import Host
from rlctl.platforms.nvidia import NvidiaPlatform
from rlctl.platforms.resolve import builtin_platform
from rlctl.platforms.rocm import RocmPlatform
from tests.engines.fakes import load_surface
from tests.platforms.vendor_hosts import ascend_910b, ascend_sglang_only, b200_sglang, h100, mi300x

WHERE = "p.toml: rollout.engine_kwargs"


def test_every_external_engine_setting_cites_a_versioned_source(tmp_path):
    hosts = {
        NvidiaPlatform: h100(tmp_path / "n", "580.82.07"),
        RocmPlatform: mi300x(tmp_path / "r"),
        AscendPlatform: ascend_910b(tmp_path / "a"),
    }
    for cls, host in hosts.items():
        for engine in ("vllm", "sglang"):
            s = cls(host).engine_settings(engine)
            assert s.engine == engine and re.search(r"(vllm|sglang|vllm-ascend) \d+\.\d+\.\d+", s.source), (
                cls,
                s,
            )


@pytest.fixture
def rocm(tmp_path):
    return RocmPlatform(mi300x(tmp_path))


def test_mi300x_vllm_keeps_its_own_backend_and_doctor_names_rocm_attn(rocm):
    """With ROCm flash-attn installed the transformers side takes flash_attention_2, but vLLM must
    not get FLASH_ATTN (it asserts on ROCm); vLLM 0.33 ranks ROCM_ATTN first."""
    assert rocm.attention_impl() == "flash_attention_2"
    s = rocm.engine_settings("vllm")
    assert s.kernel is None and s.engine_kwargs == {}
    assert "ROCM_ATTN" in s.reason and "vllm 0.33.0 vllm/platforms/rocm.py" in s.source
    chosen = [c.name for c in rocm.rollout_attention_candidates() if c.chosen]
    assert chosen == ["ROCM_ATTN"]
    flash = next(c for c in rocm.rollout_attention_candidates() if c.name == "FLASH_ATTN")
    assert not flash.chosen and "asserts" in flash.reason


def test_mi300x_refuses_a_forced_flash_attn(rocm):
    with pytest.raises(
        UserError, match=r"^p\.toml: rollout\.engine_kwargs: vLLM's FLASH_ATTN backend cannot run on ROCm"
    ):
        resolve_engine_kwargs(rocm, "vllm", {"attention_config": {"backend": "FLASH_ATTN"}}, where=WHERE)
    ok = resolve_engine_kwargs(rocm, "vllm", {"attention_config": {"backend": "TRITON_ATTN"}}, where=WHERE)
    assert ok == {"attention_config": {"backend": "TRITON_ATTN"}}


def test_rocm_sglang_uses_triton_without_aiter_and_its_default_with_it(tmp_path, rocm):
    s = rocm.engine_settings("sglang")
    assert (s.kernel, s.engine_kwargs) == ("triton", {"attention_backend": "triton"})
    assert "amd-aiter not installed" in s.reason
    from tests.platforms.fakes import make_dist

    make_dist(tmp_path / "site", "amd-aiter", "0.1.5")
    with_aiter = RocmPlatform(mi300x(tmp_path))
    assert with_aiter.engine_settings("sglang").kernel is None
    assert with_aiter.engine_settings("sglang").env == {"SGLANG_USE_AITER": "1"}
    # AITER attention, not AITER fused MoE (its post-load expert shuffle defeats in-place syncs)
    assert with_aiter.engine_settings("vllm").env == {"VLLM_ROCM_USE_AITER": "1", "VLLM_ROCM_USE_AITER_MOE": "0"}
    assert "ROCM_ATTN" in with_aiter.engine_settings("vllm").reason  # 0.33 ranks it before ROCM_AITER_FA
    assert "aiter" in with_aiter.engine_settings("sglang").reason


def test_vllm_0_13_on_rocm_picks_aiter_fa_or_triton(tmp_path):
    host = mi300x(tmp_path, env={})
    import shutil

    for d in (tmp_path / "site").glob("vllm-*.dist-info"):
        shutil.rmtree(d)
    from tests.platforms.fakes import make_dist

    make_dist(tmp_path / "site", "vllm", "0.13.0+rocm700")
    assert "TRITON_ATTN" in RocmPlatform(host).engine_settings("vllm").reason


@pytest.mark.parametrize("driver", ["570.172.08", "580.82.07"])
def test_h100_vllm_and_sglang_keep_their_own_choice(tmp_path, driver):
    p = NvidiaPlatform(h100(tmp_path, driver))
    v = p.engine_settings("vllm")
    assert v.kernel is None and v.engine_kwargs == {} and "FLASH_ATTN" in v.reason
    assert "vllm/platforms/cuda.py" in v.source
    assert p.engine_settings("fsdp").engine_kwargs == {"attn_implementation": p.attention_impl()}


def test_b200_sglang_never_gets_fa3(tmp_path):
    p = NvidiaPlatform(b200_sglang(tmp_path))
    s = p.engine_settings("sglang")
    assert s.kernel is None and "attention_backend" not in s.engine_kwargs
    assert "trtllm_mha" in s.reason and "create_flashattention_v3_backend" in s.source
    with pytest.raises(UserError, match=r"fa3 backend asserts SM 8\.x/9\.0 and this GPU is SM 10\.0"):
        resolve_engine_kwargs(p, "sglang", {"attention_backend": "fa3"}, where=WHERE)
    assert resolve_engine_kwargs(p, "sglang", {"attention_backend": "flashinfer"}, where=WHERE) == {
        "attention_backend": "flashinfer"
    }


def test_hopper_accepts_fa3_for_sglang(tmp_path):
    p = NvidiaPlatform(b200_sglang(tmp_path, cc=(9, 0)))
    assert p.engine_settings("sglang").reason.startswith("SGLang's own choice: fa3")
    assert resolve_engine_kwargs(p, "sglang", {"attention_backend": "fa3"}, where=WHERE) == {
        "attention_backend": "fa3"
    }


def test_ascend_vllm_runs_eager_by_default_and_the_profile_can_say_otherwise(tmp_path):
    p = AscendPlatform(ascend_910b(tmp_path))
    s = p.engine_settings("vllm")
    assert s.kernel is None and s.engine_kwargs == {"enforce_eager": True}
    assert "#7473" in s.source and "ACL graphs" in s.reason
    assert resolve_engine_kwargs(p, "vllm", {}, where=WHERE) == {"enforce_eager": True}
    assert resolve_engine_kwargs(p, "vllm", {"enforce_eager": False, "max_model_len": 4096}, where=WHERE) == {
        "enforce_eager": False,
        "max_model_len": 4096,
    }


def test_ascend_with_only_sglang_is_refused_up_front(tmp_path):
    """auto never picks SGLang on Ascend (not registered for the vendor): one line, before placement."""
    p = AscendPlatform(ascend_sglang_only(tmp_path))
    engine, reason = p.auto_rollout_engine()
    assert engine is None
    assert "sglang is installed, but rlctl does not run it on ascend" in reason and "\n" not in reason
    assert "sglang" not in p.rollout_engines()


@pytest.mark.parametrize("name", sorted(BUILTINS))
def test_platform_engines_are_the_ones_registered_for_the_vendor(name, tmp_path):
    """``engine_order`` (what auto may pick) lists exactly the rollout engines the registry has for
    (device, vendor); an engine a platform calls unsupported is not registered for it."""
    cls = type(builtin_platform(name, Host(root=tmp_path, env={}, path=[])))
    for engine in cls.engine_order:
        assert runs_on("rollout", engine, cls.device_type, cls.name), (name, engine)
    for engine in cls.unsupported_engines:
        assert not runs_on("rollout", engine, cls.device_type, cls.name), (name, engine)
    for engine in ("vllm", "sglang"):
        if engine not in cls.engine_order:
            assert not runs_on("rollout", engine, cls.device_type, cls.name), (name, engine)


@pytest.mark.parametrize(
    ("package", "version"),
    [
        ("vllm", "0.10.2"),
        ("vllm", "0.13.0"),
        ("vllm", "0.23.0"),
        ("vllm", "0.33.0"),
        ("sglang", "0.5.3"),
        ("sglang", "0.5.23"),
    ],
)
def test_installed_fields_are_read_from_the_release_layout(tmp_path, package, version):
    from rlctl.platforms.dists import DistIndex
    from tests.platforms.fakes import make_dist
    from tests.platforms.vendor_hosts import engine_source

    site = tmp_path / "site"
    make_dist(site, package, version)
    engine_source(site, package, version)
    surface = load_surface(package, version)
    key = "EngineArgs" if package == "vllm" else "ServerArgs"
    assert installed_fields(package, DistIndex([str(site)])) == frozenset(surface[key]["fields"])


def test_unknown_or_reserved_engine_keyword_names_key_and_version(tmp_path):
    p = NvidiaPlatform(h100(tmp_path, "580.82.07"))
    with pytest.raises(
        UserError,
        match=r"^p\.toml: rollout\.engine_kwargs\.max_mode_len: vllm 0\.33\.0 has no EngineArgs field 'max_mode_len'",
    ):
        resolve_engine_kwargs(p, "vllm", {"max_mode_len": 4096}, where=WHERE)
    with pytest.raises(
        UserError,
        match=r"rollout\.engine_kwargs\.gpu_memory_utilization: set by rollout\.gpu_memory_utilization",
    ):
        resolve_engine_kwargs(p, "vllm", {"gpu_memory_utilization": 0.9}, where=WHERE)
    with pytest.raises(UserError, match=r"the hf rollout engine reads no engine keywords"):
        resolve_engine_kwargs(p, "hf", {"max_model_len": 1}, where=WHERE)
    assert resolve_engine_kwargs(p, "vllm", {"max_model_len": 8192}, where=WHERE) == {"max_model_len": 8192}


def test_install_advice_per_vendor(tmp_path):
    """`pip install 'rlctl[vllm]'` pulls PyPI's CUDA 13 wheel: wrong on ROCm and Ascend, and on an
    NVIDIA driver below 580."""
    old = NvidiaPlatform(h100(tmp_path / "570", "570.172.08")).engine_install_hint("vllm")
    assert "upgrade the NVIDIA driver to >= 580" in old and "CUDA 12 build" in old
    assert (
        NvidiaPlatform(h100(tmp_path / "580", "580.82.07")).engine_install_hint("vllm")
        == "pip install 'rlctl[vllm]'"
    )
    rocm = RocmPlatform(mi300x(tmp_path / "r")).engine_install_hint("vllm")
    assert "ROCm build" in rocm and not rocm.startswith("pip install 'rlctl")
    ascend = AscendPlatform(ascend_910b(tmp_path / "a")).engine_install_hint("vllm")
    assert "vllm-ascend==0.23.0.post1" in ascend and "not pip install 'rlctl[vllm]'" in ascend


@pytest.mark.parametrize("cc, first", [((10, 0), "FLASHINFER"), ((9, 0), "FLASH_ATTN")])
def test_nvidia_vllm_candidates_choose_what_vllm_picks(tmp_path, cc, first):
    """The candidate list doctor shows chooses vLLM 0.33's own pick: FLASHINFER on SM 10."""
    p = NvidiaPlatform(b200_sglang(tmp_path, cc=cc))  # flashinfer-python installed
    chosen = [c.name for c in p.rollout_attention_candidates() if c.chosen]
    assert chosen == [first] and f"{first} for a decoder model" in p.engine_settings("vllm").reason


@pytest.mark.parametrize("value, refused", [("1", True), ("True", True), ("0", False)])
def test_rocm_aiter_fused_moe_is_refused_for_in_place_syncs(tmp_path, value, refused):
    """A user's VLLM_ROCM_USE_AITER_MOE=1 (vllm 0.33.0's default once AITER is on) is one line
    before start-up: AITER's MoE shuffles the experts after loading, rlctl loads them in place."""
    from tests.platforms.fakes import make_dist

    make_dist(tmp_path / "site", "amd-aiter", "0.1.5")
    p = RocmPlatform(mi300x(tmp_path))
    p.host.env["VLLM_ROCM_USE_AITER_MOE"] = value
    if refused:
        with pytest.raises(UserError, match=r"^p\.toml: rollout\.engine_kwargs: VLLM_ROCM_USE_AITER_MOE=1"):
            resolve_engine_kwargs(p, "vllm", {}, where=WHERE)
    else:
        assert resolve_engine_kwargs(p, "vllm", {}, where=WHERE) == {}
