"""``rlctl doctor --json`` through the CLI entry point on simulated vendor hosts.

Each host is a fake sysfs/dev tree, fake installed distributions and the vendor tool's recorded
answer (tests/platforms/fakes.py); the CLI resolves the platform on it as it would on the real
machine. Checked: platform, device count, backend, engine, and the verdicts that matter.
"""

from __future__ import annotations

import json

import pytest

from rlctl.cli.main import main
from tests.platforms.fakes import (
    ascend_busy_host,
    make_dist,
    nvidia_container_host,
    nvidia_host,
    ray_needing_amdsmi,
    rocm_host,
    touch,
)


def doctor_json(host, monkeypatch, capsys, *args: str) -> tuple[int, dict]:
    """Run ``rlctl doctor --json`` with ``host`` as the machine; (exit code, document)."""
    import rlctl.platforms.resolve as resolve

    monkeypatch.delenv("RLCTL_PLATFORM", raising=False)
    monkeypatch.setattr(resolve, "Host", lambda env=None: host)
    with pytest.raises(SystemExit) as done:
        main(["doctor", "--json", *args])
    out = capsys.readouterr().out
    return int(done.value.code or 0), json.loads(out)


def rows(doc: dict) -> dict[str, dict]:
    return {c["name"]: c for c in doc["checks"]}


def verdicts(doc: dict) -> dict[str, str]:
    return {c["name"]: c["verdict"] for c in doc["checks"]}


def test_nvidia_host(tmp_path, monkeypatch, capsys):
    host = nvidia_host(tmp_path)
    make_dist(tmp_path / "site", "vllm", "0.11.0", requires=("torch==2.7.1",))
    code, doc = doctor_json(host, monkeypatch, capsys)
    plat, v = doc["platform"], verdicts(doc)
    assert (plat["name"], plat["device_count"], plat["dist_backend"]) == ("nvidia", 8, "nccl")
    assert rows(doc)["rollout-engine"]["reason"].startswith("vllm: installed")
    assert v["driver"] == v["pin:torch-cuda-driver"] == v["pin:vllm-min"] == "PASS"
    assert rows(doc)["env:vendor"]["reason"].startswith("rlctl sets NCCL_CUMEM_ENABLE=0")
    assert code == 0 and doc["exit_code"] == 0


def test_nvidia_host_keeps_the_users_nccl_cumem(tmp_path, monkeypatch, capsys):
    host = nvidia_host(tmp_path, env={"NCCL_CUMEM_ENABLE": "1"})
    code, doc = doctor_json(host, monkeypatch, capsys)
    assert doc["platform"]["rollout_env"] == {"NCCL_CUMEM_ENABLE": "1"}
    assert doc["platform"]["rollout_env_sources"]["user_set"] == {"NCCL_CUMEM_ENABLE": "1"}
    assert "keeps your NCCL_CUMEM_ENABLE=1" in rows(doc)["env:vendor"]["reason"]
    assert verdicts(doc)["pin:nccl-cumem"] == "PASS"


def test_nvidia_container_without_devices(tmp_path, monkeypatch, capsys):
    code, doc = doctor_json(nvidia_container_host(tmp_path), monkeypatch, capsys)
    plat = doc["platform"]
    assert (plat["name"], plat["device_count"], plat["dist_backend"]) == ("cpu", 1, "gloo")
    assert plat["resolution"]["probes"]["nvidia"]["found"] is False
    assert rows(doc)["rollout-engine"]["reason"].startswith("hf")
    warn = rows(doc)["probe:nvidia"]
    assert warn["verdict"] == "WARN" and "no /dev/nvidia" in warn["reason"] and "--gpus all" in warn["fix"]
    assert code == 0


def _rocm_stack(tmp_path, amdsmi: bool):
    host = rocm_host(tmp_path)
    site = tmp_path / "site"
    ray_needing_amdsmi(site)
    make_dist(site, "vllm", "0.11.1+rocm700", requires=("torch==2.7.1",))
    if amdsmi:
        make_dist(site, "amdsmi", "7.0.2")
        touch(tmp_path / "root", "/opt/rocm/lib/libamd_smi.so")
    return host


def test_rocm_host_with_amdsmi(tmp_path, monkeypatch, capsys):
    code, doc = doctor_json(_rocm_stack(tmp_path, amdsmi=True), monkeypatch, capsys)
    plat, v = doc["platform"], verdicts(doc)
    assert (plat["name"], plat["device_count"], plat["dist_backend"], plat["ray_resource"]) == (
        "rocm", 8, "nccl", "GPU",
    )  # fmt: skip
    assert rows(doc)["rollout-engine"]["reason"].startswith("vllm")
    assert v["ray-devices"] == "PASS" and v["pin:vllm-cuda-wheel-on-rocm"] == "PASS"
    assert code == 0, [c for c in doc["checks"] if c["verdict"] == "FAIL"]


def test_rocm_host_without_amdsmi(tmp_path, monkeypatch, capsys):
    code, doc = doctor_json(_rocm_stack(tmp_path, amdsmi=False), monkeypatch, capsys)
    row = rows(doc)["ray-devices"]
    assert doc["platform"]["name"] == "rocm" and doc["platform"]["device_count"] == 8
    assert row["verdict"] == "FAIL" and "amdsmi" in row["reason"] and "placement group" in row["reason"]
    assert "amdsmi" in row["fix"]
    assert code == 1


def test_rocm_without_engine_is_not_told_to_install_the_cuda_wheel(tmp_path, monkeypatch, capsys):
    code, doc = doctor_json(rocm_host(tmp_path), monkeypatch, capsys)
    row = rows(doc)["rollout-engine"]
    assert row["verdict"] == "WARN" and "rlctl[vllm]" not in row["fix"] and "ROCm build" in row["fix"]


def test_ascend_910b_with_running_processes(tmp_path, monkeypatch, capsys):
    host = ascend_busy_host(tmp_path, cann="8.3.RC2", torch_npu="2.7.1.post1")
    make_dist(tmp_path / "site", "vllm", "0.11.0")
    make_dist(tmp_path / "site", "vllm-ascend", "0.11.0")
    code, doc = doctor_json(host, monkeypatch, capsys)
    plat, v = doc["platform"], verdicts(doc)
    assert (plat["name"], plat["device_count"], plat["dist_backend"], plat["ray_resource"]) == (
        "ascend", 8, "hccl", "NPU",
    )  # fmt: skip
    assert rows(doc)["rollout-engine"]["reason"].startswith("vllm")
    assert v["pin:vllm-ascend-vllm"] == v["pin:vllm-ascend-matrix"] == v["driver"] == "PASS"
    busy = rows(doc)["devices-busy"]
    assert busy["verdict"] == "WARN" and "NPU 2 chip 0 pid 1333928 (37709 MB)" in busy["reason"]
    assert code == 0, [c for c in doc["checks"] if c["verdict"] == "FAIL"]


def test_ascend_a3(tmp_path, monkeypatch, capsys):
    host = ascend_busy_host(tmp_path, a3=True, cann="8.5.0", torch="2.9.0", torch_npu="2.9.0")
    make_dist(tmp_path / "site", "vllm", "0.14.1")
    make_dist(tmp_path / "site", "vllm-ascend", "0.14.0rc1")  # pairs with vLLM 0.14.1 in the matrix
    code, doc = doctor_json(host, monkeypatch, capsys)
    plat, v = doc["platform"], verdicts(doc)
    assert (plat["name"], plat["device_count"], plat["dist_backend"]) == ("ascend", 16, "hccl")
    assert "16 device(s)" in rows(doc)["driver"]["reason"]
    assert v["pin:vllm-ascend-vllm"] == "PASS" and v["pin:vllm-ascend-matrix"] == "PASS"
    assert rows(doc)["devices-busy"]["verdict"] == "WARN"
    assert code == 0, [c for c in doc["checks"] if c["verdict"] == "FAIL"]


def test_ascend_without_torch_npu_is_told_to_install_torch_npu(tmp_path, monkeypatch, capsys):
    host = ascend_busy_host(tmp_path)
    import shutil

    shutil.rmtree(next((tmp_path / "site").glob("torch_npu-*.dist-info")))
    code, doc = doctor_json(host, monkeypatch, capsys)
    torch_row, engine = rows(doc)["torch"], rows(doc)["rollout-engine"]
    assert torch_row["verdict"] == "FAIL" and "torch-npu==2.7.1" in torch_row["fix"]
    assert engine["verdict"] == "FAIL" and engine["fix"] == "pip install torch-npu==2.7.1"
    assert code == 1


def test_usage_error_still_prints_json(monkeypatch, capsys):
    with pytest.raises(SystemExit) as done:
        main(["doctor", "--json", "--timeout", "soon"])
    doc = json.loads(capsys.readouterr().out)
    assert done.value.code == 2 and doc["exit_code"] == 2 and "soon" in doc["error"]


def test_unknown_vendor_prints_json(tmp_path, monkeypatch, capsys):
    code, doc = doctor_json(nvidia_host(tmp_path), monkeypatch, capsys, "--vendor", "bogus")
    assert code == 2 and "unknown platform 'bogus'" in doc["error"] and doc["checks"] == []
