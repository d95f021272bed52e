"""Doctor's 'lora sync' row says how a LoRA actor's weights reach the platform's rollout engine."""

from __future__ import annotations

from rlctl.doctor.checks_lora import check_lora_sync
from rlctl.platforms.cpu import CpuPlatform
from rlctl.platforms.nvidia import NvidiaPlatform
from rlctl.verdict import Verdict
from tests.platforms.fakes import cpu_host, nvidia_host


def test_hf_engine_gets_the_adapter_alone(tmp_path):
    row = check_lora_sync(CpuPlatform(cpu_host(tmp_path)))
    assert row.verdict is Verdict.PASS and row.reason.startswith("hf: adapter-only sync")


def test_an_engine_without_adapter_sync_is_named_as_merged(tmp_path, monkeypatch):
    platform = NvidiaPlatform(nvidia_host(tmp_path))
    monkeypatch.setattr(platform, "rollout_engine", lambda: "vllm")
    row = check_lora_sync(platform)
    assert row.verdict is Verdict.WARN and row.reason.startswith("vllm: merged-weight sync")
    assert "rollout.engine = 'hf'" in row.fix
