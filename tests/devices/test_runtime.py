"""The platform's runtime half: ``DeviceRuntime`` drives the devices a ``RuntimeSpec`` names,
importing the vendor's torch module first, with no device table of its own."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlctl.devices import DeviceRuntime, runtime_of
from rlctl.platforms.runtime_spec import CPU_RUNTIME, RuntimeSpec

REPO = Path(__file__).resolve().parents[2]
VE = RuntimeSpec("ve", "gloo", "VE", "VE_VISIBLE_DEVICES", "tests.devices.fake_accel")


def test_cpu_runtime_is_the_cpu_and_its_accelerator_calls_are_no_ops():
    rt = DeviceRuntime(CPU_RUNTIME)
    assert rt.module is None and rt.device(3) == torch.device("cpu")
    assert rt.device_count() == 1 and rt.is_available() and rt.dist_backend == "gloo"
    rt.set_device(0)
    rt.synchronize()
    rt.empty_cache()
    assert rt.peak_memory_bytes() is None


def test_spec_round_trips_through_json():
    assert RuntimeSpec.from_json(VE.to_json()) == VE
    assert json.loads(VE.to_json())["torch_module"] == "tests.devices.fake_accel"


def test_vendor_module_is_imported_then_driven_through_torch(monkeypatch):
    """``torch.ve`` does not exist until the platform's torch_module registers it: the runtime
    imports it, then set_device / synchronize / empty_cache / the peak go to that module."""
    rt = DeviceRuntime(VE)
    assert rt.device(2) == torch.device("ve", 2)
    from tests.devices import fake_accel

    fake_accel.CALLS.clear()
    assert rt.device_count() == 3
    rt.set_device(1)
    rt.synchronize()
    rt.empty_cache()
    assert [
        ("set_device", torch.device("ve", 1)),
        ("synchronize", None),
        ("empty_cache", None),
    ] == fake_accel.CALLS
    assert rt.peak_memory_bytes() == 5 << 20
    # an engine knows only its torch device: the same module, torch's default backend
    assert runtime_of(torch.device("ve", 0)).module is torch.ve
    assert runtime_of("cpu").dist_backend == "gloo"


def test_missing_vendor_module_is_named():
    rt = DeviceRuntime(RuntimeSpec("ipu", "gloo", "IPU", None, "no_such_vendor_module"))
    assert not rt.is_available() and rt.device_count() == 0
    with pytest.raises(ImportError, match="no_such_vendor_module"):
        rt.module  # noqa: B018


def test_device_count_child_is_what_doctor_runs():
    """``python -m rlctl.devices SPEC`` (doctor --deep's device count) counts through the
    platform's module: 3 on the toy accelerator, an error naming a missing module."""
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    run = [sys.executable, "-m", "rlctl.devices"]
    ok = subprocess.run([*run, VE.to_json()], capture_output=True, text=True, env=env, timeout=120)
    assert ok.returncode == 0 and ok.stdout.strip().splitlines()[-1] == "3", ok.stderr
    bad = RuntimeSpec("ipu", "gloo", "IPU", None, "no_such_vendor_module").to_json()
    err = subprocess.run([*run, bad], capture_output=True, text=True, env=env, timeout=120)
    assert err.returncode != 0 and "no_such_vendor_module" in err.stderr


def test_rlctl_plan_never_loads_the_runtime_half():
    """``rlctl plan`` reads only the declarative half: neither torch nor rlctl.devices is imported."""
    code = (
        "import sys\nfrom rlctl.cli.main import main\ntry:\n    main(['plan', sys.argv[1]])\n"
        "except SystemExit:\n    pass\n"
        "print(sorted(m for m in ('torch', 'rlctl.devices') if m in sys.modules), file=sys.stderr)"
    )
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", code, str(REPO / "profiles/tiny-cpu.toml")],
        capture_output=True, text=True, env=env, timeout=120, cwd=REPO,
    )  # fmt: skip
    assert proc.stderr.strip().splitlines()[-1] == "[]", proc.stderr[-2000:]
