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
from tests.platforms.vendor_hosts import ascend_910b, ascend_sglang_only, b200_sglang, h100, mi300x


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
    # the platform's own engine first (vllm + vllm-ascend), the HF engine's install second
    assert engine["verdict"] == "FAIL" and engine["fix"].startswith("pip install vllm, then vllm-ascend")
    assert engine["fix"].endswith("""for rollout.engine = "hf": pip install 'torch-npu==2.7.1.*'""")
    assert code == 1


def test_ascend_torch_fix_follows_vllm_ascends_pins(tmp_path, monkeypatch, capsys):
    """torch 2.13 under vllm-ascend 0.23.0.post1 without torch_npu: the fix is vllm-ascend's own
    pins (torch==2.10.0, torch-npu==2.10.0.post4), not a torch_npu for the torch that is there."""
    import shutil

    from tests.platforms.vendor_hosts import replace

    host = ascend_910b(tmp_path)
    shutil.rmtree(next((tmp_path / "site").glob("torch_npu-*.dist-info")))
    replace(tmp_path / "site", "torch", "2.13.0")
    code, doc = doctor_json(host, monkeypatch, capsys)
    fix = rows(doc)["torch"]["fix"]
    assert "torch==2.10.0" in fix and "torch-npu==2.10.0.post4" in fix and "2.13" not in fix
    assert code == 1


def test_usage_error_still_prints_json(monkeypatch, capsys):
    with pytest.raises(SystemExit) as done:
        main(["doctor", "--json", "--timeout", "soon"])
    doc = json.loads(capsys.readouterr().out)
    assert done.value.code == 2 and doc["exit_code"] == 2 and "soon" in doc["error"]


def test_unknown_vendor_prints_json(tmp_path, monkeypatch, capsys):
    code, doc = doctor_json(nvidia_host(tmp_path), monkeypatch, capsys, "--vendor", "bogus")
    assert code == 2 and "unknown platform 'bogus'" in doc["error"] and doc["checks"] == []


# -- the per-vendor engine settings hosts (tests/platforms/vendor_hosts.py) --------------------------
def test_h100_with_driver_570_is_told_driver_580_or_the_cuda12_build(tmp_path, monkeypatch, capsys):
    """vllm 0.33.0's PyPI wheel is CUDA 13 and pins torch==2.14.0: another torch is no fix."""
    code, doc = doctor_json(h100(tmp_path, "570.172.08"), monkeypatch, capsys)
    pin = rows(doc)["pin:torch-cuda-driver"]
    assert pin["verdict"] == "FAIL" and "driver 570.172.08 is below 580" in pin["reason"]
    assert "upgrade the NVIDIA driver to >= 580" in pin["fix"] and "vllm's CUDA 12 build" in pin["fix"]
    assert "install a torch" not in pin["fix"]
    engine = rows(doc)["engine:vllm"]
    assert (
        engine["details"]["kernel"] is None
        and "FLASH_ATTN" in engine["reason"]
        and engine["details"]["engine_kwargs"] == {}
    )
    assert code == 1


def test_h100_with_driver_580_passes(tmp_path, monkeypatch, capsys):
    code, doc = doctor_json(h100(tmp_path, "580.82.07"), monkeypatch, capsys)
    v = verdicts(doc)
    assert v["pin:torch-cuda-driver"] == v["pin:vllm-torch"] == v["pin:vllm-transformers"] == "PASS"
    assert rows(doc)["rollout-engine"]["reason"].startswith("vllm: installed (vllm 0.33.0)")
    assert code == 0, [c for c in doc["checks"] if c["verdict"] == "FAIL"]


def test_b200_sglang_is_never_told_fa3(tmp_path, monkeypatch, capsys):
    code, doc = doctor_json(b200_sglang(tmp_path), monkeypatch, capsys)
    engine = rows(doc)["engine:sglang"]
    assert (
        engine["details"]["kernel"] is None and "attention_backend" not in engine["details"]["engine_kwargs"]
    )
    assert "trtllm_mha" in engine["reason"] and "fa3 never forced" in engine["reason"]
    assert rows(doc)["rollout-engine"]["reason"].startswith("sglang: installed")
    assert verdicts(doc)["pin:sglang-torch"] == "PASS"
    assert code == 0, [c for c in doc["checks"] if c["verdict"] == "FAIL"]


def test_mi300x_with_cuda_visible_devices_and_noset(tmp_path, monkeypatch, capsys):
    """ROCm vLLM + flash-attn: vLLM keeps ROCM_ATTN (not FLASH_ATTN, not ROCM_AITER_FA); the exported
    CUDA_VISIBLE_DEVICES (vLLM raises at import) and verl's NOSET variable (every rank on GPU 0) FAIL."""
    code, doc = doctor_json(mi300x(tmp_path), monkeypatch, capsys)
    r, v = rows(doc), verdicts(doc)
    assert (
        r["attention"]["reason"].startswith("flash_attention_2")
        and "(training and HF rollout)" in r["attention"]["reason"]
    )
    assert r["engine:vllm"]["details"]["kernel"] is None and "ROCM_ATTN" in r["engine:vllm"]["reason"]
    assert r["engine:sglang"]["details"]["engine_kwargs"] == {"attention_backend": "triton"}
    assert (
        v["pin:rocm-cuda-visible-devices"] == "FAIL"
        and "HIP_VISIBLE_DEVICES" in r["pin:rocm-cuda-visible-devices"]["fix"]
    )
    assert (
        v["pin:ray-noset-hip-visible-devices"] == "FAIL"
        and "GPU 0" in r["pin:ray-noset-hip-visible-devices"]["reason"]
    )
    assert v["pin:vllm-cuda-wheel-on-rocm"] == "PASS"
    assert code == 1
    code, doc = doctor_json(mi300x(tmp_path / "clean", env={}), monkeypatch, capsys)
    assert code == 0, [c for c in doc["checks"] if c["verdict"] == "FAIL"]


def test_ascend_910b_with_vllm_ascend_0_23_0_post1(tmp_path, monkeypatch, capsys):
    """vllm 0.23.0 wants torch 2.11.0 but vllm-ascend 0.23.0.post1 (installed after it) pins 2.10.0 and
    torch-npu 2.10.0.post4: the correct install passes, and vLLM's own torch pin does not apply."""
    code, doc = doctor_json(ascend_910b(tmp_path), monkeypatch, capsys)
    v, r = verdicts(doc), rows(doc)
    assert v["pin:vllm-torch"] == "SKIP" and "vllm-ascend is installed" in r["pin:vllm-torch"]["reason"]
    assert v["pin:vllm-ascend-torch"] == v["pin:vllm-ascend-torch-npu"] == "PASS"
    assert v["pin:vllm-ascend-matrix"] == v["pin:vllm-ascend-vllm"] == "PASS"
    assert "python >=3.10,<3.13" in r["pin:vllm-ascend-matrix"]["reason"]
    assert r["engine:vllm"]["details"]["engine_kwargs"] == {"enforce_eager": True}
    assert code == 0, [c for c in doc["checks"] if c["verdict"] == "FAIL"]


def test_ascend_matrix_checks_the_python_column(tmp_path, monkeypatch, capsys):
    host = ascend_910b(tmp_path)
    host.python = "3.13.1"
    code, doc = doctor_json(host, monkeypatch, capsys)
    pin = rows(doc)["pin:vllm-ascend-matrix"]
    assert pin["verdict"] == "FAIL" and "python 3.13.1 (wants >=3.10,<3.13)" in pin["reason"]


def test_ascend_with_only_sglang_is_refused_in_one_line(tmp_path, monkeypatch, capsys):
    code, doc = doctor_json(ascend_sglang_only(tmp_path), monkeypatch, capsys)
    engine = rows(doc)["rollout-engine"]
    assert "sglang is installed, but rlctl does not run it on ascend" in engine["reason"]
    assert (
        "vllm-ascend" in engine["fix"] and "rlctl[vllm]" in engine["fix"]
    )  # "not pip install 'rlctl[vllm]'"
    assert "engine:sglang" not in rows(doc)


def test_evaluate_pins_is_per_engine(tmp_path):
    """The run's preflight: pins of an engine the run does not use are SKIP."""
    from rlctl.platforms.nvidia import NvidiaPlatform
    from rlctl.platforms.pin_checks import evaluate_pins
    from tests.platforms.fakes import make_dist

    host = h100(tmp_path, "580.82.07")
    make_dist(tmp_path / "site", "sglang", "0.5.23", requires=("torch==2.14.1",))  # wrong torch for SGLang
    p = NvidiaPlatform(host)
    all_engines = {v.details["id"]: v.verdict for v in evaluate_pins(p)}
    assert all_engines["pin:sglang-torch".removeprefix("pin:")] == "FAIL"
    vllm_run = {v.details["id"]: v for v in evaluate_pins(p, "vllm")}
    assert vllm_run["sglang-torch"].verdict == "SKIP" and vllm_run["vllm-torch"].verdict == "PASS"
    assert {v.details["id"]: v.verdict for v in evaluate_pins(p, "sglang")}["sglang-torch"] == "FAIL"


def test_sglang_pins_are_not_judged_where_sglang_never_runs(tmp_path):
    from rlctl.platforms.ascend import AscendPlatform
    from rlctl.platforms.pin_checks import evaluate_pins

    v = {p.details["id"]: p for p in evaluate_pins(AscendPlatform(ascend_sglang_only(tmp_path)))}
    assert v["sglang-torch"].verdict == "SKIP" and "does not run on ascend" in v["sglang-torch"].reason
