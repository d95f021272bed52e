"""Platforms against recorded vendor-tool output and the real libraries' source: npu-smi's process
table and A3 layout, a GPU container without devices, Ray's amdsmi dependency on ROCm, vendor
environment defaults, bounded plugin probes, and pins re-read against their sources."""

from __future__ import annotations

from importlib.metadata import EntryPoint

from rlctl.platforms import Facts, evaluate_pin, load_pins, resolve_platform
from rlctl.platforms.ascend import AscendPlatform
from rlctl.platforms.dists import DistIndex, TorchBuild
from rlctl.platforms.nvidia import NvidiaPlatform
from rlctl.platforms.rocm import RocmPlatform
from rlctl.platforms.smi import parse_npu_smi
from tests.platforms.fakes import (
    NPU_SMI_910B_BUSY,
    NPU_SMI_A3,
    FakePynvml,
    ascend_busy_host,
    make_dist,
    make_torch,
    nvidia_container_host,
    nvidia_host,
    ray_needing_amdsmi,
    rocm_host,
    touch,
)

PINS = {p.id: p for p in load_pins()}


def facts(site, platform="ascend", env=None, details=None) -> Facts:
    dists = DistIndex([str(site)])
    return Facts(platform, dists, TorchBuild(dists.version("torch"), "cpu"), env or {}, details or {})


# ---------------------------------------------------------------- npu-smi


def test_npu_smi_process_table_is_not_counted_as_devices():
    out = parse_npu_smi(NPU_SMI_910B_BUSY)
    assert len(out["devices"]) == 8 and [d["npu"] for d in out["devices"]] == list(range(8))
    assert out["processes"] == [{"npu": 2, "chip": 0, "pid": 1333928, "name": "", "memory_mb": 37709}]
    assert out["driver_version"] == "25.2.0"


def test_npu_smi_a3_layout_one_device_per_chip():
    out = parse_npu_smi(NPU_SMI_A3)
    devs = out["devices"]
    assert len(devs) == 16
    assert [d["index"] for d in devs] == list(range(16))
    assert [d["phy_id"] for d in devs] == list(range(16))
    assert [(d["npu"], d["chip"]) for d in devs[:4]] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert {d["name"] for d in devs} == {"Ascend910"}
    assert len(out["processes"]) == 5 and out["processes"][2] == {
        "npu": 0, "chip": 1, "pid": 3328327, "name": "", "memory_mb": 50119,
    }  # fmt: skip


def test_ascend_device_counts_on_busy_910b_and_a3(tmp_path):
    p = AscendPlatform(ascend_busy_host(tmp_path / "b"))
    assert p.device_count() == 8 and len(p.probe().details["processes"]) == 1
    a3 = AscendPlatform(ascend_busy_host(tmp_path / "a3", a3=True))
    assert a3.device_count() == 16 and "16 NPU(s)" in a3.probe().reason
    assert "bfloat16" in a3.supported_dtypes()


def test_cann_version_quotes_are_dropped(tmp_path):
    host = ascend_busy_host(tmp_path, cann='"8.5.0"')
    assert AscendPlatform(host).cann_version() == "8.5.0"


# ---------------------------------------------------------------- NVIDIA container


def test_container_without_gpu_access_is_not_nvidia(tmp_path):
    host = nvidia_container_host(tmp_path)
    probe = NvidiaPlatform(host).probe()
    assert not probe.found
    assert "no /dev/nvidia" in probe.reason and "LibraryNotFound" in probe.reason
    assert "--gpus all" in probe.details["near_miss_fix"]
    p = resolve_platform(env={}, host=host, entry_points=[])
    assert p.name == "cpu" and p.resolution.tier == "fallback"


def test_device_files_with_broken_nvml_still_nvidia(tmp_path):
    # the driver is there but broken (error 18 after an upgrade): found, and doctor FAILs the driver
    probe = NvidiaPlatform(nvidia_host(tmp_path, FakePynvml(init_error=18))).probe()
    assert probe.found and "near_miss" not in probe.details


# ---------------------------------------------------------------- ROCm under Ray


def test_ray_without_amdsmi_sees_no_amd_gpu(tmp_path):
    host = rocm_host(tmp_path)
    ray_needing_amdsmi(tmp_path / "site")
    status, reason, fix = RocmPlatform(host).ray_gpu_check()
    assert status == "fail" and "amdsmi" in reason and "0 GPUs" in reason and "amdsmi" in fix


def test_ray_with_amdsmi_but_no_library_cannot_even_import(tmp_path):
    host = rocm_host(tmp_path)
    ray_needing_amdsmi(tmp_path / "site")
    make_dist(tmp_path / "site", "amdsmi", "7.0.2")
    status, reason, _ = RocmPlatform(host).ray_gpu_check()
    assert status == "fail" and "KeyError: 'libamd_smi.so'" in reason
    touch(tmp_path / "root", "/opt/rocm/lib/libamd_smi.so")
    status, reason, _ = RocmPlatform(rocm_host(tmp_path)).ray_gpu_check()
    assert status == "ok" and "amdsmi 7.0.2" in reason


def test_older_ray_without_the_shim_needs_no_amdsmi(tmp_path):
    assert RocmPlatform(rocm_host(tmp_path)).ray_gpu_check()[0] == "ok"


def test_unrelated_pypi_aiter_does_not_switch_on_aiter(tmp_path):
    make_dist(tmp_path / "site", "aiter", "0.13.20191203")  # async-iterator helpers on PyPI
    p = RocmPlatform(rocm_host(tmp_path))
    assert "VLLM_ROCM_USE_AITER" not in p.rollout_env()
    aiter_fa = next(c for c in p.rollout_attention_candidates() if c.name == "ROCM_AITER_FA")
    assert aiter_fa.reason == "amd-aiter not installed" and not aiter_fa.chosen


def test_rocm_engine_hint_is_not_the_cuda_wheel(tmp_path):
    p = RocmPlatform(rocm_host(tmp_path))
    reason = p.auto_rollout_engine()[1]
    assert "rlctl[vllm]" not in reason and "ROCm build of vLLM" in reason


# ---------------------------------------------------------------- vendor env


def test_user_nccl_cumem_value_wins(tmp_path):
    p = NvidiaPlatform(nvidia_host(tmp_path, env={"NCCL_CUMEM_ENABLE": "1"}))
    assert p.rollout_env() == {"NCCL_CUMEM_ENABLE": "1"}
    assert p.env_sources() == {"rlctl_sets": {}, "user_set": {"NCCL_CUMEM_ENABLE": "1"}}
    q = NvidiaPlatform(nvidia_host(tmp_path / "b"))
    assert q.env_sources() == {"rlctl_sets": {"NCCL_CUMEM_ENABLE": "0"}, "user_set": {}}


# ---------------------------------------------------------------- bounded probes


def test_sleeping_plugin_probe_is_abandoned(tmp_path):
    from tests.platforms.fakes import cpu_host

    host = cpu_host(tmp_path, env={"RLCTL_PROBE_TIMEOUT_S": "0.5"})
    eps = [EntryPoint("sleepy", "tests.platforms.plugin_fixture:SleepyPlatform", "rlctl.platforms")]
    p = resolve_platform(env={}, host=host, entry_points=eps)
    assert p.name == "cpu"
    probe = p.resolution.probes["plugin:sleepy"]
    assert not probe.found and "did not return within 0.5s" in probe.reason


def test_plugin_calling_sys_exit_is_a_load_error(tmp_path):
    from tests.platforms.fakes import cpu_host

    eps = [
        EntryPoint("quitter", "tests.platforms.plugin_fixture:exiting_factory", "rlctl.platforms"),
        EntryPoint("exiter", "tests.platforms.plugin_fixture:ExitingProbe", "rlctl.platforms"),
    ]
    p = resolve_platform(env={}, host=cpu_host(tmp_path), entry_points=eps)
    assert p.name == "cpu"
    assert "sys.exit(3)" in p.resolution.plugin_errors["quitter"]
    assert "sys.exit" in p.resolution.probes["plugin:exiter"].reason


# ---------------------------------------------------------------- pins against their sources


def test_vllm_ascend_rc_pairs_with_the_vllm_its_row_names(tmp_path):
    make_dist(tmp_path, "vllm-ascend", "0.14.0rc1")
    make_dist(tmp_path, "vllm", "0.14.1")
    out = evaluate_pin(PINS["vllm-ascend-vllm"], facts(tmp_path))
    assert out.details["status"] == "ok", out.reason
    make_dist(tmp_path / "b", "vllm-ascend", "0.14.0rc1")
    make_dist(tmp_path / "b", "vllm", "0.14.0")
    bad = evaluate_pin(PINS["vllm-ascend-vllm"], facts(tmp_path / "b"))
    assert bad.details["status"] == "violated" and "wants 0.14.1" in bad.reason


def test_whole_matrix_knows_current_releases(tmp_path):
    rows = PINS["vllm-ascend-matrix"].params["rows"]
    assert len(rows) >= 35 and {"0.23.0", "0.18.0", "0.13.0", "0.11.0rc1"} <= {r["vllm-ascend"] for r in rows}
    for name, v in (("vllm-ascend", "0.23.0"), ("vllm", "0.23.0"), ("torch-npu", "2.10.0.post4")):
        make_dist(tmp_path, name, v)
    make_torch(tmp_path, "2.10.0")
    ok = evaluate_pin(PINS["vllm-ascend-matrix"], facts(tmp_path, details={"cann_version": '"9.1.0"'}))
    assert ok.details["status"] == "ok", ok.reason
    old = evaluate_pin(PINS["vllm-ascend-matrix"], facts(tmp_path, details={"cann_version": "8.5.1"}))
    assert old.details["status"] == "violated" and "cann 8.5.1 (wants 9.1.0)" in old.reason


def test_vllm_ascend_newer_than_the_matrix_is_unknown(tmp_path):
    make_dist(tmp_path, "vllm-ascend", "0.99.0")
    out = evaluate_pin(PINS["vllm-ascend-matrix"], facts(tmp_path))
    assert out.details["status"] == "unknown" and "not in rlctl's copy" in out.reason


def test_rocr_visible_devices_is_fine_next_to_hip(tmp_path):
    make_dist(tmp_path, "ray", "2.60.0")
    env = {"ROCR_VISIBLE_DEVICES": "0", "HIP_VISIBLE_DEVICES": "0"}
    assert evaluate_pin(PINS["rocr-visible-devices"], facts(tmp_path, "rocm", env=env)).details["status"] == "ok"
    make_dist(tmp_path / "old", "ray", "2.44.1")  # before ray#51104 Ray itself used ROCR_VISIBLE_DEVICES
    old = evaluate_pin(
        PINS["rocr-visible-devices"], facts(tmp_path / "old", "rocm", env={"ROCR_VISIBLE_DEVICES": "0"})
    )
    assert old.details["status"] == "n/a"


def test_attention_backend_env_judged_by_the_installed_vllm(tmp_path):
    env = {"VLLM_ATTENTION_BACKEND": "FLASHINFER"}
    make_dist(tmp_path / "new", "vllm", "0.33.0")
    (tmp_path / "new" / "vllm").mkdir()
    (tmp_path / "new" / "vllm" / "envs.py").write_text("VLLM_HOST_IP: str = ''\n")  # 0.33.0: no such var
    out = evaluate_pin(PINS["vllm-attention-backend-env"], facts(tmp_path / "new", "nvidia", env=env))
    assert out.details["status"] == "violated" and "never reads it" in out.reason
    assert (
        "passes the attention backend to the engine explicitly" not in PINS["vllm-attention-backend-env"].fix
    )
    make_dist(tmp_path / "old", "vllm", "0.10.2")
    (tmp_path / "old" / "vllm").mkdir()
    (tmp_path / "old" / "vllm" / "envs.py").write_text('"VLLM_ATTENTION_BACKEND": lambda: None,\n')
    ok = evaluate_pin(PINS["vllm-attention-backend-env"], facts(tmp_path / "old", "nvidia", env=env))
    assert ok.details["status"] == "ok" and "reads it" in ok.reason


def test_pin_texts_say_what_their_sources_say():
    assert (
        "s_aux" in PINS["transformers-5.6.0"].source
        and "flash_attention_2" in PINS["transformers-5.6.0"].symptom
    )
    assert "loading" not in PINS["transformers-5.6.0"].symptom
    assert "flash-attn-on-ascend" not in PINS  # transformers 5.24 takes the NPU branch first
    assert "import ray" in PINS["amdsmi-without-rocm"].symptom
