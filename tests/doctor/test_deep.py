"""``--deep`` pieces with real child processes: engine imports and a 2-rank gloo all-reduce."""

from __future__ import annotations

import pytest

from rlctl.doctor.checks_packages import check_pins
from rlctl.doctor.deep import check_collective, check_imports, try_imports
from rlctl.platforms.cpu import CpuPlatform
from rlctl.platforms.nvidia import NvidiaPlatform
from rlctl.verdict import Verdict
from tests.platforms.fakes import make_dist, nvidia_host


@pytest.mark.timeout(180)
def test_gloo_allreduce_two_ranks():
    row = check_collective(CpuPlatform(), timeout=150)
    assert row.verdict is Verdict.PASS, row.reason
    assert row.name == "collective:gloo" and "2-rank" in row.reason


@pytest.mark.timeout(180)
def test_collective_failure_is_a_fail_row_not_a_crash(tmp_path):
    # the NVIDIA platform on this CPU-only machine: the child cannot select a CUDA device
    p = NvidiaPlatform(nvidia_host(tmp_path))
    row = check_collective(p, timeout=150, world=1)
    assert row.verdict is Verdict.FAIL and "nccl" in row.reason


@pytest.mark.timeout(120)
def test_flash_attn_built_for_other_torch(tmp_path, monkeypatch):
    host = nvidia_host(tmp_path)
    site = tmp_path / "site"
    make_dist(site, "flash-attn", "2.8.3")
    (site / "flash_attn").mkdir()
    (site / "flash_attn" / "__init__.py").write_text(
        "raise ImportError('flash_attn_2_cuda.cpython-311-x86_64-linux-gnu.so: undefined symbol: _ZN3c105ErrorC2E')\n"
    )
    monkeypatch.setenv("PYTHONPATH", str(site))
    p = NvidiaPlatform(host)
    imports = try_imports(p, timeout=100)
    assert "undefined symbol" in imports["flash_attn"]
    rows = {c.name: c for c in check_imports(imports) + check_pins(p, imports)}
    assert rows["import:flash_attn"].verdict is Verdict.FAIL
    pin = rows["pin:flash-attn-abi"]
    assert pin.verdict is Verdict.FAIL and "undefined symbol" in pin.reason and "force-reinstall" in pin.fix
    assert {c.name: c for c in check_pins(p)}["pin:flash-attn-abi"].verdict is Verdict.SKIP
