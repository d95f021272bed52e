"""``rlctl doctor`` end to end through the installed console script, in child processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.platforms.fakes import make_dist

RLCTL = str(Path(sys.executable).with_name("rlctl"))
pytestmark = pytest.mark.timeout(120)


def run(*args: str, env: dict | None = None, pythonpath: Path | None = None) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k not in ("RLCTL_PLATFORM", "PYTHONPATH")}
    full.update(env or {})
    if pythonpath is not None:
        full["PYTHONPATH"] = str(pythonpath)
    proc = subprocess.run([RLCTL, "doctor", *args], capture_output=True, text=True, env=full, timeout=100)
    assert "Traceback" not in proc.stderr + proc.stdout
    return proc


def checks(proc) -> dict:
    return {c["name"]: c for c in json.loads(proc.stdout)["checks"]}


def test_doctor_here_resolves_cpu_and_passes():
    proc = run()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "platform: cpu" in proc.stdout and "PASS" in proc.stdout


def test_json_parses_and_logs_stay_off_stdout():
    proc = run("--json")
    assert proc.returncode == 0, proc.stdout
    doc = json.loads(proc.stdout)
    assert doc["platform"]["name"] == "cpu"
    assert doc["platform"]["dist_backend"] == "gloo" and doc["platform"]["attention_impl"] == "sdpa"
    assert doc["platform"]["resolution"]["tier"] == "fallback"
    assert doc["summary"]["FAIL"] == 0 and doc["exit_code"] == 0
    assert checks(proc)["torch"]["verdict"] == "PASS"


def test_fake_vllm_073_fails_the_pin(tmp_path):
    make_dist(tmp_path, "vllm", "0.7.3")
    proc = run("--json", pythonpath=tmp_path)
    assert proc.returncode == 1
    pin = checks(proc)["pin:vllm-min"]
    assert pin["verdict"] == "FAIL" and "0.7.3" in pin["reason"] and "OOM" in pin["reason"]
    assert "vllm>=0.10.2" in pin["fix"]
    table = run(pythonpath=tmp_path)
    assert table.returncode == 1 and "pin:vllm-min" in table.stdout


def test_fake_vllm_with_other_torch_pin_fails(tmp_path):
    make_dist(tmp_path, "vllm", "0.10.2", requires=("torch==2.7.0", "transformers>=4.51.1"))
    proc = run("--json", pythonpath=tmp_path)
    assert proc.returncode == 1
    rows = checks(proc)
    assert rows["pin:vllm-min"]["verdict"] == "PASS"
    assert rows["pin:vllm-torch"]["verdict"] == "FAIL" and "torch==2.7.0" in rows["pin:vllm-torch"]["reason"]
    assert rows["deps:vllm"]["verdict"] == "FAIL"


def test_forced_nvidia_here_fails_without_traceback():
    proc = run(env={"RLCTL_PLATFORM": "nvidia"})
    assert proc.returncode == 1
    assert "no NVIDIA driver" in proc.stdout


def test_bogus_platform_is_a_user_error():
    proc = run(env={"RLCTL_PLATFORM": "bogus"})
    assert proc.returncode == 2
    assert "unknown platform 'bogus'" in proc.stderr and "nvidia" in proc.stderr
    proc = run("--vendor", "bogus")
    assert proc.returncode == 2 and "platform.vendor" in proc.stderr


def test_vendor_option_overrides_env():
    proc = run("--json", "--vendor", "cpu", env={"RLCTL_PLATFORM": "nvidia"})
    assert proc.returncode == 0 and json.loads(proc.stdout)["platform"]["resolution"]["tier"] == "explicit"


def test_secrets_in_env_never_printed():
    env = {"HF_TOKEN": "hf_do_not_print_me", "NCCL_DEBUG": "WARN"}
    proc = run("--json", env=env)
    assert "hf_do_not_print_me" not in proc.stdout + proc.stderr
    assert checks(proc)["env"]["details"]["variables"]["NCCL_DEBUG"] == "WARN"


def test_out_of_tree_plugin_via_real_entry_point(tmp_path):
    (tmp_path / "acme_rlctl.py").write_text(
        "from rlctl.platforms import Platform, ProbeResult\n"
        "class AcmePlatform(Platform):\n"
        "    name = 'acme'\n"
        "    dist_backend = 'gloo'\n"
        "    ray_resource = 'ACME'\n"
        "    torch_flavours = ('cpu',)\n"
        "    def _probe(self):\n"
        "        return ProbeResult(True, 'ACME card on bus 3')\n"
    )
    make_dist(
        tmp_path, "acme-rlctl", "1.0", entry_points="[rlctl.platforms]\nacme = acme_rlctl:AcmePlatform\n"
    )
    proc = run("--json", pythonpath=tmp_path)
    assert proc.returncode == 0, proc.stdout
    plat = json.loads(proc.stdout)["platform"]
    assert plat["name"] == "acme" and plat["ray_resource"] == "ACME"
    assert plat["resolution"]["tier"] == "plugin" and "ACME card on bus 3" in plat["resolution"]["reason"]
    # and it is listed as a known name when something unknown is asked for
    proc = run(env={"RLCTL_PLATFORM": "nope"}, pythonpath=tmp_path)
    assert proc.returncode == 2 and "acme" in proc.stderr


def test_profile_platform_vendor_is_used(tmp_path):
    shipped = Path(__file__).resolve().parents[2] / "profiles" / "tiny-cpu.toml"
    if not shipped.exists():
        pytest.skip("profiles/tiny-cpu.toml not present")
    prof = tmp_path / "p.toml"
    prof.write_text(shipped.read_text().replace('vendor = "cpu"', 'vendor = "nvidia"'))
    proc = run("--json", "--profile", str(prof))
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(proc.stdout)
    assert (
        doc["platform"]["name"] == "nvidia" and "platform.vendor" in doc["platform"]["resolution"]["reason"]
    )
