"""The CPU platform: gloo collectives, Ray CPU resources, HF transformers rollout, SDPA attention.

It is the real embedded default (not a stand-in) and the last resort of auto-resolution.
"""

from __future__ import annotations

import os
import platform as _pyplatform
from typing import Any

from rlctl.platforms.base import Candidate, Platform, ProbeResult, choose
from rlctl.verdict import Check, skipped


class CpuPlatform(Platform):
    """Runs anywhere: training with FSDP2 over gloo, rollout with HF ``generate``."""

    name = "cpu"
    dist_backend = "gloo"
    ray_resource = "CPU"
    device_type = "cpu"
    torch_flavours = ("cpu", "cuda", "rocm")  # any torch runs on the CPU
    engine_order = ("hf",)
    torch_install = "pip install torch --index-url https://download.pytorch.org/whl/cpu"

    def _probe(self) -> ProbeResult:
        cores = os.cpu_count() or 1
        machine = _pyplatform.machine() or "unknown"
        return ProbeResult(
            True,
            f"CPU is always available ({cores} cores, {machine})",
            {"devices": [{"index": 0, "name": f"{machine} CPU", "cores": cores}]},
        )

    def attention_candidates(self) -> list[Candidate]:
        torch_ok = self.host.torch.flavour != "none"  # a described target: present, version unknown
        return choose(
            [
                ("flash_attention_2", False, "flash-attn kernels need a CUDA/ROCm/NPU device"),
                (
                    "sdpa",
                    torch_ok,
                    "torch scaled_dot_product_attention runs on CPU" if torch_ok else "no torch",
                ),
                ("eager", True, "plain PyTorch attention, always available"),
            ]
        )

    def supported_dtypes(self) -> list[str]:
        # float16 matmuls on CPU are slow or missing for many ops; bfloat16 is well supported
        return ["float32", "bfloat16"]

    def driver_check(self, details: dict[str, Any]) -> Check | None:
        return skipped("driver", "no accelerator driver needed on CPU", "driver")

    def collective_world(self) -> int:
        """Two ranks share the CPU: doctor's all-reduce always has someone to talk to."""
        return 2
