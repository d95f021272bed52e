"""Doctor's package, import and requirement rows for the built-in vendors, now read from their
platform files: the same rows in the same order as the lists doctor kept itself, except that the
``deps:`` rows list a vendor's extensions in its declared order (torch-npu before vllm-ascend)."""

from __future__ import annotations

from rlctl.doctor import packages
from rlctl.doctor.checks_packages import check_consistency, check_packages
from rlctl.platforms.ascend import AscendPlatform
from rlctl.platforms.cpu import CpuPlatform
from rlctl.platforms.nvidia import NvidiaPlatform
from rlctl.verdict import Verdict
from tests.platforms.vendor_hosts import ascend_910b

PACKAGE_ROWS = [
    "torch", "transformers", "ray", "safetensors", "tokenizers", "nvidia-ml-py", "pyrsmi", "amdsmi",
    "vllm", "sglang", "flash-attn", "flashinfer-python", "torch-npu", "vllm-ascend", "accelerate", "peft",
]  # fmt: skip
IMPORTS = {
    "torch": "torch", "transformers": "transformers", "vllm": "vllm", "sglang": "sglang",
    "flash-attn": "flash_attn", "torch-npu": "torch_npu", "vllm-ascend": "vllm_ascend",
}  # fmt: skip


def test_every_built_in_platform_reports_the_same_packages_in_the_same_order():
    for p in (CpuPlatform(), NvidiaPlatform(), AscendPlatform()):
        assert [c.name for c in check_packages(p)] == [f"package:{n}" for n in PACKAGE_ROWS]
        assert list(packages.packages(p).values()) == [True] * 5 + [False] * 11  # the first five required
        assert list(packages.imports(p).items()) == list(IMPORTS.items())
        assert packages.overrides(p) == {"vllm": "vllm-ascend"}


def test_ascend_requirement_rows_and_vllm_ascends_override(tmp_path):
    """vllm 0.23.0 pins torch 2.11.0, vllm-ascend 0.23.0.post1 (installed after it) torch 2.10.0:
    vllm's pin does not count, so every row passes; the vendor's extensions follow vLLM."""
    rows = check_consistency(AscendPlatform(ascend_910b(tmp_path)))
    names = ("torch", "transformers", "ray", "vllm", "torch-npu", "vllm-ascend")
    assert [c.name for c in rows] == [f"deps:{n}" for n in names]
    assert all(c.verdict is Verdict.PASS for c in rows), [c.reason for c in rows]
