"""SMI parsing against fakes of the real libraries, and the child-process wrapper for real."""

from __future__ import annotations

import pytest

from rlctl.platforms.smi import parse_npu_smi, query_nvml, query_rocml, run_smi
from tests.platforms.fakes import NPU_SMI_INFO, FakePynvml, FakeRocml

pytestmark = pytest.mark.timeout(120)


def test_nvml_answer():
    fake = FakePynvml(names=["NVIDIA H200", "NVIDIA H200"])
    out = query_nvml(fake)
    assert out["ok"] and out["driver_version"] == "570.124.06"
    assert out["cuda_driver_version"] == 12080 and out["cuda_driver"] == "12.8"
    assert out["devices"][1] == {"index": 1, "name": "NVIDIA H200", "memory_total": 150_754_820_096,
                                 "compute_capability": [9, 0]}  # fmt: skip
    assert fake.shutdowns == 1


def test_nvml_bytes_strings_from_old_bindings():
    out = query_nvml(FakePynvml(driver=b"535.183.01", cuda_driver=12020))
    assert out["driver_version"] == "535.183.01" and out["cuda_driver"] == "12.2"


@pytest.mark.parametrize(
    ("code", "name"), [(9, "DriverNotLoaded"), (4, "NoPermission"), (12, "LibraryNotFound")]
)
def test_nvml_init_errors_keep_name_and_code(code, name):
    out = query_nvml(FakePynvml(init_error=code))
    assert out == {"ok": False, "error": out["error"], "code": code}
    assert name in out["error"]


def test_rocml_answer_and_missing_library():
    out = query_rocml(FakeRocml(names=["AMD Instinct MI300X"]))
    assert out == {
        "ok": True,
        "devices": [{"index": 0, "name": "AMD Instinct MI300X", "memory_total": 206_141_652_992}],
    }
    out = query_rocml(FakeRocml(missing=True))
    assert not out["ok"] and "ROCMLError_LibraryNotFound" in out["error"]


def test_npu_smi_info_parse():
    out = parse_npu_smi(NPU_SMI_INFO)
    assert out["ok"] and out["driver_version"] == "24.1.0"
    assert [(d["index"], d["npu"], d["chip"], d["name"], d["health"]) for d in out["devices"]] == [
        (0, 0, 0, "910B3", "OK"),
        (1, 1, 0, "910B3", "OK"),
    ]
    assert out["devices"][0]["bus_id"] == "0000:C1:00.0" and out["processes"] == []
    assert not parse_npu_smi("dcmi module initialize failed. ret is -8005")["ok"]


def test_real_nvml_child_here_reports_missing_library():
    # this machine has nvidia-ml-py but no driver: nvmlInit raises NVMLError_LibraryNotFound
    out = run_smi("nvidia", timeout=60)
    assert out["ok"] is False and "NVML" in out["error"]


def test_broken_vendor_library_that_prints_and_raises(tmp_path, monkeypatch):
    # like amdsmi from PyPI without ROCm: prints to stdout, then raises KeyError on import
    pkg = tmp_path / "pyrsmi"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "rocml.py").write_text("print('amdsmi: library not found')\nraise KeyError('libamd_smi.so')\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    out = run_smi("rocm", timeout=60)
    assert out["ok"] is False and "KeyError" in out["error"] and "libamd_smi.so" in out["error"]


def test_hanging_vendor_library_times_out(tmp_path, monkeypatch):
    pkg = tmp_path / "pyrsmi"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "rocml.py").write_text("import time\ntime.sleep(60)\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    out = run_smi("rocm", timeout=3)
    assert out == {"ok": False, "error": "rocm SMI query timed out after 3s"}


def test_unknown_vendor():
    assert run_smi("acme")["ok"] is False
