"""``rlctl doctor`` survives what plugins and vendor packages do to it, as a real child process:
a probe that sleeps, a plugin that calls ``sys.exit``, a ``torch.backends`` plugin (torch_npu)
that breaks ``import torch``."""

from __future__ import annotations

import json

import pytest

from tests.doctor.test_cli import checks, run
from tests.platforms.fakes import make_dist

pytestmark = pytest.mark.timeout(120)


def _plugin(tmp_path, body: str, name: str = "vendorx") -> None:
    (tmp_path / f"{name}_rlctl.py").write_text(body)
    make_dist(
        tmp_path, f"{name}-rlctl", "1.0", entry_points=f"[rlctl.platforms]\n{name} = {name}_rlctl:Plugin\n"
    )


def test_sleeping_probe_and_exiting_plugin_do_not_stop_doctor(tmp_path):
    _plugin(
        tmp_path,
        "import time\n"
        "from rlctl.platforms import Platform, ProbeResult\n"
        "class Plugin(Platform):\n"
        "    name = 'vendorx'\n"
        "    def _probe(self):\n"
        "        time.sleep(3600)\n"
        "        return ProbeResult(True, 'never')\n",
    )
    _plugin(tmp_path, "import sys\nsys.exit(0)\n", name="vendory")  # exits while being imported
    proc = run("--json", env={"RLCTL_PROBE_TIMEOUT_S": "2"}, pythonpath=tmp_path)
    doc = json.loads(proc.stdout)
    assert doc["platform"]["name"] == "cpu"
    assert "did not return within 2s" in doc["platform"]["resolution"]["probes"]["plugin:vendorx"]["reason"]
    row = checks(proc)["plugin:vendory"]
    assert row["verdict"] == "WARN" and "sys.exit(0)" in row["reason"]
    assert proc.returncode == 0


def test_broken_torch_npu_breaks_import_torch_and_doctor_says_so(tmp_path):
    # torch_npu 2.14.0's entry_points.txt: [torch.backends] torch_npu = torch_npu:_autoload; torch
    # calls it inside `import torch` (torch/__init__.py _import_device_backends)
    make_dist(
        tmp_path,
        "torch-npu",
        "2.13.0",
        requires=("torch==2.13.0.*",),
        entry_points="[torch.backends]\ntorch_npu = torch_npu:_autoload\n",
    )
    (tmp_path / "torch_npu").mkdir()
    (tmp_path / "torch_npu" / "__init__.py").write_text(
        "raise ImportError('libhccl.so: cannot open shared object file: No such file or directory')\n"
    )
    proc = run("--json", pythonpath=tmp_path)
    row = checks(proc)["torch-import"]
    assert row["verdict"] == "FAIL" and "libhccl.so" in row["reason"] and "torch-npu" in row["reason"]
    assert "TORCH_DEVICE_BACKEND_AUTOLOAD=0" in row["fix"]
    assert proc.returncode == 1
