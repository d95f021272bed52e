"""Detection and per-platform answers on simulated NVIDIA, ROCm, Ascend and CPU hosts."""

from __future__ import annotations

import shutil
import sys

from hypothesis import given
from hypothesis import strategies as st

from rlctl.platforms.ascend import AscendPlatform
from rlctl.platforms.cpu import CpuPlatform
from rlctl.platforms.host import Host
from rlctl.platforms.nvidia import NvidiaPlatform
from rlctl.platforms.rocm import RocmPlatform, gfx_name
from tests.platforms.fakes import FakePynvml, ascend_host, cpu_host, make_dist, nvidia_host, rocm_host, touch


def test_import_does_not_pull_heavy_stacks():
    import subprocess

    code = (
        "import sys, rlctl.platforms as p; p.resolve_platform();"
        "bad=[m for m in ('torch','ray','pynvml','transformers','pyrsmi','amdsmi') if m in sys.modules];"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_nvidia_host_detected_with_nvml_details(tmp_path):
    p = NvidiaPlatform(nvidia_host(tmp_path))
    probe = p.probe()
    assert probe.found, probe.reason
    assert "8 x NVIDIA H200" in probe.reason and "570.124.06" in probe.reason and "CUDA 12.8" in probe.reason
    assert probe.details["cuda_driver"] == "12.8"
    assert probe.details["devices"][0]["compute_capability"] == [9, 0]
    assert (p.dist_backend, p.ray_resource, p.device_type) == ("nccl", "GPU", "cuda")
    assert p.visible_devices_env == "CUDA_VISIBLE_DEVICES"
    assert p.ray_noset_env == "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"
    assert p.runtime_spec().ray_noset_env == p.ray_noset_env  # carried to every worker
    assert p.rollout_env() == {"NCCL_CUMEM_ENABLE": "0"}
    assert p.supported_dtypes() == ["float32", "float16", "bfloat16", "float8_e4m3fn"]
    assert p.device_count() == 8


def test_nvidia_attention_prefers_flash_attn_when_installed_and_capable(tmp_path):
    host = nvidia_host(tmp_path)
    assert NvidiaPlatform(host).attention_impl() == "sdpa"  # no flash-attn installed
    make_dist(tmp_path / "site", "flash-attn", "2.8.3")
    p = NvidiaPlatform(nvidia_host(tmp_path))
    cands = p.attention_candidates()
    assert [c.name for c in cands] == ["flash_attention_2", "flash_attention_3", "sdpa", "eager"]
    assert cands[0].chosen and "2.8.3" in cands[0].reason and "sm90" in cands[0].reason
    assert not cands[2].chosen and "comes first" in cands[2].reason


def test_nvidia_turing_gets_no_flash_attn_and_no_bf16(tmp_path):
    make_dist(tmp_path / "site", "flash-attn", "2.8.3")
    p = NvidiaPlatform(nvidia_host(tmp_path, FakePynvml(names=["Tesla T4"], cc=(7, 5))))
    cands = {c.name: c for c in p.attention_candidates()}
    assert not cands["flash_attention_2"].chosen and "sm75" in cands["flash_attention_2"].reason
    assert p.attention_impl() == "sdpa"
    assert "bfloat16" not in p.supported_dtypes()


def test_nvidia_nvml_failure_is_kept_as_reason(tmp_path):
    # device files present but the driver was upgraded under the module: NVML error 18
    p = NvidiaPlatform(nvidia_host(tmp_path, FakePynvml(init_error=18)))
    probe = p.probe()
    assert probe.found
    assert "NVMLError_LibRmVersionMismatch" in probe.details["smi_error"]
    assert "reboot" in probe.details["smi_error"]


def test_nvidia_absent_on_empty_tree(tmp_path):
    probe = NvidiaPlatform(cpu_host(tmp_path)).probe()
    assert not probe.found and probe.reason.startswith("no NVIDIA driver")


def test_smi_query_that_raises_never_escapes(tmp_path):
    host = nvidia_host(tmp_path)

    def boom(vendor):
        raise KeyError("libamd_smi.so")

    host.smi = boom
    probe = NvidiaPlatform(host).probe()
    assert probe.found and "KeyError" in probe.details["smi_error"]


def test_probe_crash_becomes_not_found(tmp_path):
    class Broken(CpuPlatform):
        name = "broken"

        def _probe(self):
            raise OSError("sysfs went away")

    probe = Broken(cpu_host(tmp_path)).probe()
    assert not probe.found and "OSError: sysfs went away" in probe.reason


def test_gfx_names():
    assert gfx_name(90402) == "gfx942"
    assert gfx_name(90500) == "gfx950"
    assert gfx_name(90010) == "gfx90a"
    assert gfx_name(0) is None


def test_rocm_host_detected(tmp_path):
    p = RocmPlatform(rocm_host(tmp_path))
    probe = p.probe()
    assert probe.found, probe.reason
    assert probe.details["gfx_archs"] == ["gfx942"]
    assert probe.details["rocm_version"] == "6.3.1"
    assert probe.details["devices"][0]["name"] == "AMD Instinct MI300X"
    assert (p.dist_backend, p.ray_resource, p.device_type) == ("nccl", "GPU", "cuda")
    assert p.visible_devices_env == "HIP_VISIBLE_DEVICES"
    assert p.ray_noset_env == "RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES"
    assert p.runtime_spec().ray_noset_env == p.ray_noset_env  # carried to every worker
    assert p.rollout_env() == {"NCCL_CUMEM_ENABLE": "0"}  # no aiter installed
    assert "float8_e4m3fnuz" in p.supported_dtypes()


def test_rocm_old_ray_uses_rocr_variables(tmp_path):
    p = RocmPlatform(rocm_host(tmp_path, ray="2.44.1"))
    assert p.visible_devices_env == "ROCR_VISIBLE_DEVICES"
    assert p.ray_noset_env == "RAY_EXPERIMENTAL_NOSET_ROCR_VISIBLE_DEVICES"


def test_rocm_aiter_and_ck_flash_attn(tmp_path):
    site = tmp_path / "site"
    make_dist(site, "flash-attn", "2.8.3")
    make_dist(site, "amd-aiter", "0.1.5")  # AMD's aiter distribution (ROCm/aiter setup.py)
    p = RocmPlatform(rocm_host(tmp_path))
    assert p.rollout_env()["VLLM_ROCM_USE_AITER"] == "1"
    assert p.rollout_env()["SGLANG_USE_AITER"] == "1"
    assert p.attention_impl() == "flash_attention_2"
    assert "CK backend" in p.attention_candidates()[0].reason
    # vllm 0.13.0 vllm/platforms/rocm.py: VLLM_ROCM_USE_AITER=1 on gfx9 -> ROCM_AITER_FA
    make_dist(site, "vllm", "0.13.0+rocm700")
    p = RocmPlatform(rocm_host(tmp_path))
    assert p.rollout_attention_candidates()[0].name == "ROCM_AITER_FA"
    assert p.rollout_attention_candidates()[0].chosen
    # vllm 0.33.0 vllm/platforms/rocm.py _get_backend_priorities: ROCM_ATTN before ROCM_AITER_FA
    for d in site.glob("vllm-*.dist-info"):
        shutil.rmtree(d)
    make_dist(site, "vllm", "0.33.0+rocm700")
    p = RocmPlatform(rocm_host(tmp_path))
    assert [c.name for c in p.rollout_attention_candidates() if c.chosen] == ["ROCM_ATTN"]


def test_rocm_unlisted_arch_needs_triton_flash_attn(tmp_path):
    make_dist(tmp_path / "site", "flash-attn", "2.8.3")
    p = RocmPlatform(rocm_host(tmp_path, arch_version=110000))  # gfx1100 (RDNA3)
    assert p.attention_impl() == "sdpa"
    assert "FLASH_ATTENTION_TRITON_AMD_ENABLE" in p.attention_candidates()[0].reason
    p2 = RocmPlatform(
        rocm_host(tmp_path, arch_version=110000, env={"FLASH_ATTENTION_TRITON_AMD_ENABLE": "TRUE"})
    )
    assert p2.attention_impl() == "flash_attention_2"
    assert "Triton" in p2.attention_candidates()[0].reason
    assert "VLLM_ROCM_USE_AITER" not in p2.rollout_env()


def test_rocm_not_live(tmp_path):
    touch(tmp_path / "root", "/sys/module/amdgpu/initstate", "coming\n")
    probe = RocmPlatform(Host(root=tmp_path / "root", env={}, path=[])).probe()
    assert not probe.found
    assert "amdgpu module not live" in probe.reason and "no /dev/kfd" in probe.reason


def test_ascend_host_detected(tmp_path):
    p = AscendPlatform(ascend_host(tmp_path))
    probe = p.probe()
    assert probe.found, probe.reason
    assert probe.details["cann_version"] == "8.3.RC1"
    assert probe.details["driver_version"] == "24.1.0"
    assert [d["name"] for d in probe.details["devices"]] == ["910B3", "910B3"]
    assert (p.dist_backend, p.ray_resource, p.device_type) == ("hccl", "NPU", "npu")
    assert p.visible_devices_env == "ASCEND_RT_VISIBLE_DEVICES"
    assert p.ray_noset_env == "RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES"
    assert p.runtime_spec().ray_noset_env == p.ray_noset_env  # carried to every worker
    assert p.attention_impl() == "flash_attention_2"
    assert "npu_fusion_attention" in p.attention_candidates()[0].reason
    assert "bfloat16" in p.supported_dtypes()


def test_ascend_rollout_engine_needs_vllm_ascend(tmp_path):
    site = tmp_path / "site"
    make_dist(site, "vllm", "0.11.0")
    p = AscendPlatform(ascend_host(tmp_path))
    assert p.rollout_engines() == ["vllm", "hf"]  # SGLang is not registered for Ascend
    assert p.rollout_engine() is None  # auto never falls back to HF on an accelerator
    assert 'rollout.engine = "hf"' in p.auto_rollout_engine()[1]
    assert "vllm-ascend missing" in p.rollout_engine_candidates()[0].reason
    make_dist(site, "vllm-ascend", "0.11.0rc1")
    p = AscendPlatform(ascend_host(tmp_path))
    assert p.rollout_engine() == "vllm"
    assert p.installed_rollout_engines() == ["vllm", "hf"]


def test_ascend_absent(tmp_path):
    probe = AscendPlatform(cpu_host(tmp_path)).probe()
    assert not probe.found and "davinci" in probe.reason


def test_cpu_platform(tmp_path):
    p = CpuPlatform(cpu_host(tmp_path))
    assert p.probe().found
    assert (p.dist_backend, p.ray_resource, p.device_type) == ("gloo", "CPU", "cpu")
    assert p.visible_devices_env is None and p.ray_noset_env is None
    assert p.attention_impl() == "sdpa"
    assert p.rollout_engines() == ["hf"] and p.rollout_engine() == "hf"
    assert p.rollout_env() == {}
    assert all(pin.applies_to("cpu") for pin in p.pins)


@given(major=st.integers(8, 12), minor=st.integers(0, 9), step=st.integers(0, 15))
def test_gfx_name_matches_llvm_target_spelling(major, minor, step):
    assert gfx_name(major * 10000 + minor * 100 + step) == f"gfx{major}{minor}{step:x}"


def test_rocm_smi_failure_falls_back_to_kfd_topology(tmp_path):
    host = rocm_host(tmp_path)
    host.smi = lambda v: {"ok": False, "error": "RuntimeError: AMD GPU driver not initialized."}
    p = RocmPlatform(host)
    probe = p.probe()
    assert probe.found and "driver not initialized" in probe.details["smi_error"]
    assert p.device_count() == 2 and probe.details["devices"][0]["name"] == "gfx942"


def test_nvidia_vllm_attention_backends(tmp_path):
    p = NvidiaPlatform(nvidia_host(tmp_path, FakePynvml(names=["Tesla T4"], cc=(7, 5))))
    cands = p.rollout_attention_candidates()
    assert [c.name for c in cands] == ["FLASH_ATTN", "FLASHINFER", "TRITON_ATTN", "FLEX_ATTENTION"]
    assert not cands[0].chosen and cands[2].chosen  # no FlashAttention on sm75, no flashinfer installed
    assert CpuPlatform(cpu_host(tmp_path / "c")).rollout_attention_candidates() == []
