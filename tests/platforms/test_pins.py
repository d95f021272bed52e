"""The shipped pin file and every pin kind against fake installed distributions."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlctl.errors import UserError
from rlctl.platforms import Facts, evaluate_pin, load_pins
from rlctl.platforms.dists import DistIndex, TorchBuild
from rlctl.platforms.pins import parse_pins
from tests.platforms.fakes import make_dist, make_torch

PINS = {p.id: p for p in load_pins()}


def facts(tmp_path, platform="cpu", env=None, details=None, imports=None, torch=None) -> Facts:
    dists = DistIndex([str(tmp_path)])
    tb = torch or TorchBuild(dists.version("torch"), "cpu")
    return Facts(platform, dists, tb, env or {}, details or {}, imports)


def test_shipped_pins_have_source_symptom_fix():
    assert len(PINS) >= 18
    for pin in PINS.values():
        assert pin.source and pin.symptom and pin.fix
    required = {
        "vllm-min", "vllm-torch", "vllm-transformers", "sglang-torch", "sglang-transformers", "transformers-5.6.0",
        "ray-min", "torch-cuda-driver", "rocm-vllm-min", "rocm-arch-min", "torch-npu-base", "vllm-ascend-vllm",
        "vllm-ascend-matrix", "nccl-cumem", "rocr-visible-devices", "vllm-cuda-wheel-on-rocm", "amdsmi-without-rocm",
        "flash-attn-abi", "sglang-min", "vllm-rocm-sleep-min",
    }  # fmt: skip
    assert required <= set(PINS)
    assert PINS["rocm-arch-min"].params["arch_min"]["gfx950"] == "7.0"


@pytest.mark.parametrize(
    ("text", "match"),
    [
        (
            "[[pin]]\nid='a'\nkind='version'\nsource='s'\nsymptom='y'\nfix='f'\npackage='x'\n",
            "needs key 'spec'",
        ),
        ("[[pin]]\nid='a'\nkind='nope'\nsource='s'\nsymptom='y'\nfix='f'\n", "kind 'nope'"),
        ("[[pin]]\nid='a'\nkind='forbidden'\nsource='s'\nfix='f'\npackage='x'\n", "'symptom'"),
        (
            "[[pin]]\nid='a'\nkind='version'\nsource='s'\nsymptom='y'\nfix='f'\npackage='x'\nspec='>>1'\n",
            "specifier",
        ),
        ("[[pin]\n", "not valid TOML"),
    ],
)
def test_bad_pin_files_are_user_errors(text, match):
    with pytest.raises(UserError, match=match):
        parse_pins(text, "x.toml")


def test_vllm_floor_is_the_oldest_surface_the_adapter_drives(tmp_path):
    for v in ("0.7.3", "0.8.2", "0.10.1.1"):
        make_dist(tmp_path / v, "vllm", v)
        out = evaluate_pin(PINS["vllm-min"], facts(tmp_path / v))
        assert out.details["status"] == "violated" and v in out.reason and "temperature" in out.reason
    make_dist(tmp_path / "new", "vllm", "0.10.2")
    assert evaluate_pin(PINS["vllm-min"], facts(tmp_path / "new")).details["status"] == "ok"
    assert evaluate_pin(PINS["vllm-min"], facts(tmp_path / "none")).details["status"] == "n/a"


def test_sglang_floor_and_rocm_sleep_floor(tmp_path):
    make_dist(tmp_path / "old", "sglang", "0.5.2")
    out = evaluate_pin(PINS["sglang-min"], facts(tmp_path / "old"))
    assert out.details["status"] == "violated" and "seed" in out.reason
    make_dist(tmp_path / "new", "sglang", "0.5.3")
    assert evaluate_pin(PINS["sglang-min"], facts(tmp_path / "new")).details["status"] == "ok"
    make_dist(tmp_path / "r", "vllm", "0.11.0+rocm700")
    out = evaluate_pin(PINS["vllm-rocm-sleep-min"], facts(tmp_path / "r", "rocm"))
    assert out.details["status"] == "violated" and "sleep" in out.reason


def test_vllm_torch_pin_from_its_own_metadata(tmp_path):
    make_torch(tmp_path, "2.13.0+cpu")
    make_dist(tmp_path, "vllm", "0.10.0", requires=("torch==2.7.1", "transformers>=4.56"))
    out = evaluate_pin(PINS["vllm-torch"], facts(tmp_path))
    assert out.details["status"] == "violated" and "torch==2.7.1" in out.reason and "undefined symbol" in out.reason


def test_torch_pin_ignores_local_tag(tmp_path):
    make_torch(tmp_path, "2.7.1+cu126", cuda="12.6")
    make_dist(tmp_path, "vllm", "0.10.0", requires=("torch==2.7.1",))
    assert evaluate_pin(PINS["vllm-torch"], facts(tmp_path)).details["status"] == "ok"


def test_known_table_used_when_metadata_is_silent(tmp_path):
    make_torch(tmp_path, "2.13.0")
    make_dist(tmp_path, "vllm", "0.33.0")  # a source build with no Requires-Dist
    out = evaluate_pin(PINS["vllm-torch"], facts(tmp_path))
    assert out.details["status"] == "violated" and "==2.14.0" in out.reason


def test_sglang_torch_pin_behind_extra(tmp_path):
    make_torch(tmp_path, "2.13.0")
    make_dist(tmp_path, "sglang", "0.5.23", requires=('torch==2.14.1; extra == "srt"', "requests"))
    out = evaluate_pin(PINS["sglang-torch"], facts(tmp_path))
    assert out.details["status"] == "violated" and "2.14.1" in out.reason


def test_transformers_560(tmp_path):
    make_dist(tmp_path, "transformers", "5.6.0")
    assert evaluate_pin(PINS["transformers-5.6.0"], facts(tmp_path)).details["status"] == "violated"


def test_same_base_torch_npu(tmp_path):
    make_torch(tmp_path, "2.7.1")
    make_dist(tmp_path, "torch-npu", "2.7.1.post1")
    assert evaluate_pin(PINS["torch-npu-base"], facts(tmp_path, "ascend")).details["status"] == "ok"
    make_torch(tmp_path / "b", "2.8.0")
    make_dist(tmp_path / "b", "torch-npu", "2.7.1")
    out = evaluate_pin(PINS["torch-npu-base"], facts(tmp_path / "b", "ascend"))
    assert out.details["status"] == "violated" and "2.8.0" in out.reason


def test_vllm_ascend_rc_matches_vllm_release(tmp_path):
    make_dist(tmp_path, "vllm", "0.11.0")
    make_dist(tmp_path, "vllm-ascend", "0.11.0rc1")
    assert evaluate_pin(PINS["vllm-ascend-vllm"], facts(tmp_path, "ascend")).details["status"] == "ok"


def test_vllm_ascend_matrix_checks_cann(tmp_path):
    for name, v in (("vllm", "0.11.0"), ("vllm-ascend", "0.11.0rc1"), ("torch-npu", "2.7.1")):
        make_dist(tmp_path, name, v)
    make_torch(tmp_path, "2.7.1")
    ok = evaluate_pin(
        PINS["vllm-ascend-matrix"], facts(tmp_path, "ascend", details={"cann_version": "8.3.RC1"})
    )
    assert ok.details["status"] == "ok", ok.reason
    bad = evaluate_pin(
        PINS["vllm-ascend-matrix"], facts(tmp_path, "ascend", details={"cann_version": "8.1.RC1"})
    )
    assert bad.details["status"] == "violated" and "cann 8.1.RC1 (wants 8.3.RC1)" in bad.reason


def test_cuda_driver(tmp_path):
    tb = TorchBuild("2.7.1+cu128", "cuda", cuda="12.8")
    pin = PINS["torch-cuda-driver"]
    ok = evaluate_pin(
        pin,
        facts(tmp_path, "nvidia", torch=tb, details={"cuda_driver": "12.8", "driver_version": "570.124.06"}),
    )
    assert ok.details["status"] == "ok"
    old = evaluate_pin(
        pin,
        facts(tmp_path, "nvidia", torch=tb, details={"cuda_driver": "11.8", "driver_version": "520.61.05"}),
    )
    assert old.details["status"] == "violated" and "CUDA 11.8" in old.reason and "below 525" in old.reason
    tb13 = TorchBuild("2.10.0+cu130", "cuda", cuda="13.0")
    f13 = facts(
        tmp_path, "nvidia", torch=tb13, details={"cuda_driver": "13.0", "driver_version": "575.51.03"}
    )
    assert "below 580" in evaluate_pin(pin, f13).reason
    assert evaluate_pin(pin, facts(tmp_path, "nvidia", torch=tb)).details["status"] == "unknown"
    assert evaluate_pin(pin, facts(tmp_path, "cpu", torch=tb)).details["status"] == "n/a"


def test_rocm_arch_and_vllm_min(tmp_path):
    d = {"rocm_version": "6.4.1", "gfx_archs": ["gfx950"]}
    out = evaluate_pin(PINS["rocm-arch-min"], facts(tmp_path, "rocm", details=d))
    assert out.details["status"] == "violated" and "gfx950 needs ROCm >= 7.0" in out.reason
    assert (
        evaluate_pin(
            PINS["rocm-arch-min"], facts(tmp_path, "rocm", details={**d, "rocm_version": "7.0.2"})
        ).details["status"]
        == "ok"
    )
    make_dist(tmp_path, "vllm", "0.10.0+rocm624")
    assert (
        evaluate_pin(PINS["rocm-vllm-min"], facts(tmp_path, "rocm", details={"rocm_version": "6.2.4"})).details["status"]
        == "violated"
    )


def test_env_pins(tmp_path):
    # verl#7564: an externally set NCCL_CUMEM_ENABLE is respected (GB300 needs 1): never a warning
    for value in ("1", "0"):
        out = evaluate_pin(PINS["nccl-cumem"], facts(tmp_path, "nvidia", env={"NCCL_CUMEM_ENABLE": value}))
        assert out.details["status"] == "ok"
    assert (
        "is yours and is kept"
        in evaluate_pin(PINS["nccl-cumem"], facts(tmp_path, "nvidia", env={"NCCL_CUMEM_ENABLE": "1"})).reason
    )
    make_dist(tmp_path, "ray", "2.60.0")
    out = evaluate_pin(
        PINS["rocr-visible-devices"], facts(tmp_path, "rocm", env={"ROCR_VISIBLE_DEVICES": "0"})
    )
    assert out.details["status"] == "violated"
    assert (
        evaluate_pin(
            PINS["rocr-visible-devices"], facts(tmp_path, "nvidia", env={"ROCR_VISIBLE_DEVICES": "0"})
        ).details["status"]
        == "n/a"
    )


def test_cuda_vllm_wheel_on_rocm(tmp_path):
    make_dist(tmp_path, "vllm", "0.10.0", requires=("torch==2.7.1", "nvidia-cuda-runtime-cu12"))
    out = evaluate_pin(PINS["vllm-cuda-wheel-on-rocm"], facts(tmp_path, "rocm"))
    assert out.details["status"] == "violated" and "CUDA build" in out.reason
    make_dist(tmp_path / "r", "vllm", "0.10.0+rocm643")
    assert evaluate_pin(PINS["vllm-cuda-wheel-on-rocm"], facts(tmp_path / "r", "rocm")).details["status"] == "ok"


def test_forbidden_amdsmi_and_import_pin(tmp_path):
    make_dist(tmp_path, "amdsmi", "6.4.0")
    assert evaluate_pin(PINS["amdsmi-without-rocm"], facts(tmp_path, "cpu")).details["status"] == "violated"
    assert evaluate_pin(PINS["amdsmi-without-rocm"], facts(tmp_path, "rocm")).details["status"] == "n/a"
    make_dist(tmp_path, "flash-attn", "2.8.3")
    pin = PINS["flash-attn-abi"]
    assert evaluate_pin(pin, facts(tmp_path, "nvidia")).details["status"] == "unknown"
    err = "ImportError: flash_attn_2_cuda.so: undefined symbol: _ZN3c105ErrorC2E"
    out = evaluate_pin(pin, facts(tmp_path, "nvidia", imports={"flash_attn": err}))
    assert out.details["status"] == "violated" and "undefined symbol" in out.reason


def test_evaluation_never_raises(tmp_path):
    broken = dataclasses.replace(PINS["rocm-arch-min"], params={"arch_min": None})
    out = evaluate_pin(
        broken, facts(tmp_path, "rocm", details={"rocm_version": "6.3", "gfx_archs": ["gfx942"]})
    )
    assert out.details["status"] == "unknown" and "could not evaluate" in out.reason


release = st.tuples(st.integers(0, 20), st.integers(0, 20), st.integers(0, 20))


@given(a=release, b=release, post=st.sampled_from(["", ".post1", "rc1", "+cpu"]))
def test_same_base_is_release_equality(tmp_path_factory, a, b, post):
    site = tmp_path_factory.mktemp("d")
    make_dist(site, "torch-npu", ".".join(map(str, a)) + post)
    make_dist(site, "torch", ".".join(map(str, b)))
    out = evaluate_pin(PINS["torch-npu-base"], facts(site, "ascend"))
    assert out.details["status"] == ("ok" if a == b else "violated")


def test_rocr_with_hip_is_explained_as_torch_applies_them(tmp_path):
    """torch cuda/__init__.py _parse_visible_devices: ROCR is processed first, HIP selects among
    what it leaves (the old text said HIP 'takes precedence')."""
    from rlctl.platforms.pin_checks import evaluate_pins
    from rlctl.platforms.rocm import RocmPlatform
    from tests.platforms.fakes import rocm_host

    env = {"ROCR_VISIBLE_DEVICES": "0,1,2,3", "HIP_VISIBLE_DEVICES": "0,1"}
    v = {p.details["id"]: p for p in evaluate_pins(RocmPlatform(rocm_host(tmp_path, env=env)))}["rocr-visible-devices"]
    assert v.verdict == "PASS" and "ROCR_VISIBLE_DEVICES is applied first" in v.reason
    assert "takes precedence" not in v.reason
