"""Doctor checks in-process on simulated hosts: verdicts, reasons, fixes and exit codes."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from rlctl.doctor.env_vars import REDACTED, is_secret, relevant_env
from rlctl.doctor.runner import render, run_doctor
from rlctl.platforms import resolve_platform
from rlctl.platforms.nvidia import NvidiaPlatform
from rlctl.verdict import Verdict
from tests.platforms.fakes import FakePynvml, ascend_host, cpu_host, make_dist, nvidia_host, rocm_host


def by_name(report):
    return {c.name: c for c in report.checks}


def doctor_for(host, vendor="auto", eps=()):
    return run_doctor(resolve_platform(vendor, env=dict(host.env), host=host, entry_points=list(eps)))


def test_cpu_host_passes_and_serialises(tmp_path):
    rep = doctor_for(cpu_host(tmp_path))
    assert rep.exit_code == 0, [c for c in rep.checks if c.verdict is Verdict.FAIL]
    rows = by_name(rep)
    assert rows["platform"].verdict is Verdict.PASS and "cpu chosen because" in rows["platform"].reason
    assert rows["driver"].verdict is Verdict.SKIP
    assert rows["attention"].reason.startswith("sdpa")
    assert rows["deep"].verdict is Verdict.SKIP
    doc = json.loads(json.dumps(rep.to_dict(), default=str))
    assert doc["platform"]["name"] == "cpu" and doc["exit_code"] == 0
    assert doc["summary"]["FAIL"] == 0


def test_nvidia_host_good_driver(tmp_path):
    rep = doctor_for(nvidia_host(tmp_path))
    rows = by_name(rep)
    assert rows["platform"].verdict is Verdict.PASS
    assert rows["torch"].verdict is Verdict.PASS and "CUDA 12.6" in rows["torch"].reason
    assert rows["driver"].verdict is Verdict.PASS and "570.124.06" in rows["driver"].reason
    assert rows["pin:torch-cuda-driver"].verdict is Verdict.PASS
    assert rows["rollout-engine"].verdict is Verdict.WARN  # only HF installed on a GPU host
    assert rep.exit_code == 0


def test_nvidia_driver_older_than_torch_cuda_fails(tmp_path):
    host = nvidia_host(tmp_path, FakePynvml(driver="520.61.05", cuda_driver=11080), torch_cuda="12.8")
    rep = doctor_for(host)
    pin = by_name(rep)["pin:torch-cuda-driver"]
    assert pin.verdict is Verdict.FAIL and "CUDA 11.8" in pin.reason and "driver" in pin.fix
    assert rep.exit_code == 1


def test_nvidia_chosen_on_host_without_driver_fails(tmp_path):
    host = cpu_host(tmp_path)
    rep = doctor_for(host, vendor="nvidia")
    rows = by_name(rep)
    assert rows["platform"].verdict is Verdict.FAIL and "no NVIDIA driver" in rows["platform"].reason
    assert rows["torch"].verdict is Verdict.FAIL and "needs a cuda build" in rows["torch"].reason
    assert rep.exit_code == 1


def test_nvml_error_fails_driver_check(tmp_path):
    rep = run_doctor(NvidiaPlatform(nvidia_host(tmp_path, FakePynvml(init_error=18))))
    row = by_name(rep)["driver"]
    assert row.verdict is Verdict.FAIL and "LibRmVersionMismatch" in row.reason


def test_rocm_host_with_rocr_visible_devices(tmp_path):
    rep = doctor_for(rocm_host(tmp_path, env={"ROCR_VISIBLE_DEVICES": "0,1"}))
    rows = by_name(rep)
    assert rows["platform"].reason.startswith("rocm chosen because")
    assert rows["pin:rocr-visible-devices"].verdict is Verdict.FAIL
    assert "HIP_VISIBLE_DEVICES" in rows["pin:rocr-visible-devices"].fix
    assert rep.exit_code == 1


def test_rocm_cuda_vllm_wheel(tmp_path):
    make_dist(tmp_path / "site", "vllm", "0.10.1", requires=("torch==2.7.1", "nvidia-nccl-cu12"))
    rep = doctor_for(rocm_host(tmp_path))
    rows = by_name(rep)
    assert rows["pin:vllm-cuda-wheel-on-rocm"].verdict is Verdict.FAIL
    assert rows["deps:vllm"].verdict is Verdict.FAIL and "nvidia-nccl-cu12" in rows["deps:vllm"].reason


def test_ascend_host(tmp_path):
    rep = doctor_for(ascend_host(tmp_path))
    rows = by_name(rep)
    assert rows["platform"].verdict is Verdict.PASS
    assert rows["torch"].verdict is Verdict.PASS and "torch_npu 2.7.1" in rows["torch"].reason
    assert rows["driver"].verdict is Verdict.PASS and "CANN 8.3.RC1" in rows["driver"].reason
    assert rows["pin:torch-npu-base"].verdict is Verdict.PASS
    assert rep.exit_code == 0


def test_ascend_mismatched_triple(tmp_path):
    site = tmp_path / "site"
    make_dist(site, "vllm", "0.11.0")
    make_dist(site, "vllm-ascend", "0.11.0rc1")
    rep = doctor_for(ascend_host(tmp_path, cann="8.2.RC1"))
    row = by_name(rep)["pin:vllm-ascend-matrix"]
    assert row.verdict is Verdict.FAIL and "cann 8.2.RC1" in row.reason
    assert by_name(rep)["rollout-engine"].reason.startswith("vllm")


def test_dependency_consistency(tmp_path):
    make_dist(
        tmp_path / "site", "sglang", "0.5.23", requires=("xformers==0.0.30", "ray>=2.50", "transformers<4.0")
    )
    rep = doctor_for(cpu_host(tmp_path))
    row = by_name(rep)["deps:sglang"]
    assert row.verdict is Verdict.FAIL
    problems = row.details["problems"]
    assert any("xformers" in p and "not installed" in p for p in problems)
    assert any("transformers<4.0" in p and "4.57.0" in p for p in problems)
    assert not any("ray" in p for p in problems)


def test_broken_plugin_warns(tmp_path):
    from importlib.metadata import EntryPoint

    eps = [EntryPoint("bad", "tests.platforms.plugin_fixture:broken_factory", "rlctl.platforms")]
    rep = doctor_for(cpu_host(tmp_path), eps=eps)
    row = by_name(rep)["plugin:bad"]
    assert row.verdict is Verdict.WARN and "vendor SDK missing" in row.reason
    assert rep.exit_code == 0


def test_render_table_escapes_markup(tmp_path):
    from rich.console import Console

    rep = doctor_for(nvidia_host(tmp_path))
    console = Console(record=True, width=200)
    render(rep, console)
    text = console.export_text()
    assert "rlctl[vllm]" in text and "platform: nvidia" in text


def test_secret_values_never_printed(tmp_path):
    env = {"HF_TOKEN": "hf_s3cr3t_value", "WANDB_API_KEY": "wandbs3cr3t", "CUDA_VISIBLE_DEVICES": "0,1"}
    rep = doctor_for(cpu_host(tmp_path, env=env))
    dump = json.dumps(rep.to_dict(), default=str)
    assert "hf_s3cr3t_value" not in dump and "wandbs3cr3t" not in dump
    assert by_name(rep)["env"].details["variables"]["HF_TOKEN"] == REDACTED
    assert by_name(rep)["env"].details["variables"]["CUDA_VISIBLE_DEVICES"] == "0,1"


@given(
    prefix=st.sampled_from(["HF_", "WANDB_", "RAY_", "VLLM_", "RLCTL_"]),
    marker=st.sampled_from(["TOKEN", "API_KEY", "SECRET", "PASSWORD", "token"]),
    value=st.text(alphabet="abcdefXYZ0123456789_-", min_size=6, max_size=30),
)
def test_redaction_property(prefix, marker, value):
    name = f"{prefix}{marker}"
    assert is_secret(name)
    out = relevant_env({name: value, "NCCL_DEBUG": "INFO"})
    assert out[name] == REDACTED and value not in json.dumps(out).replace("NCCL_DEBUG", "").replace(
        "INFO", ""
    )


def test_url_credentials_in_values_are_redacted():
    out = relevant_env(
        {"HF_ENDPOINT": "https://bob:hunter2@mirror.example/hf", "RAY_ADDRESS": "ray://10.0.0.1:10001"}
    )
    assert out["HF_ENDPOINT"] == "https://<redacted>@mirror.example/hf"
    assert out["RAY_ADDRESS"] == "ray://10.0.0.1:10001"


def test_missing_optional_smi_library_only_warns(tmp_path):
    from rlctl.platforms.rocm import RocmPlatform

    host = rocm_host(tmp_path)
    host.smi = lambda v: {"ok": False, "error": "ModuleNotFoundError: No module named 'pyrsmi'"}
    row = by_name(run_doctor(RocmPlatform(host)))["driver"]
    assert row.verdict is Verdict.WARN and "pyrsmi" in row.fix
    host2 = rocm_host(tmp_path / "b")
    host2.smi = lambda v: {"ok": False, "error": "RuntimeError: AMD SMI initialization failed: busy"}
    assert by_name(run_doctor(RocmPlatform(host2)))["driver"].verdict is Verdict.FAIL
