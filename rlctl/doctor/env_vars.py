"""Environment variables that matter to an RL run, with secrets redacted.

A variable whose name contains TOKEN, KEY, SECRET or PASSWORD is never printed: its value is
replaced by ``<redacted>`` before it reaches any output, and ``user:pass@`` in URLs is stripped.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

SECRET_MARKERS = ("TOKEN", "KEY", "SECRET", "PASSWORD")
REDACTED = "<redacted>"
PREFIXES = (
    "CUDA_", "HIP_", "ROCR_", "ROCM_", "ASCEND_", "NCCL_", "RCCL_", "HCCL_", "GLOO_", "RAY_", "VLLM_",
    "SGLANG_", "HF_", "HUGGING_FACE_", "TRANSFORMERS_", "TORCH_", "PYTORCH_", "FLASH_ATTENTION_",
    "RLCTL_", "WANDB_", "NVIDIA_", "OPENAI_",
)  # fmt: skip
NAMES = ("OMP_NUM_THREADS", "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK",
         "TOKENIZERS_PARALLELISM")  # fmt: skip


def is_secret(name: str) -> bool:
    """True for names like HF_TOKEN, WANDB_API_KEY, AWS_SECRET_ACCESS_KEY, DB_PASSWORD."""
    upper = name.upper()
    return any(m in upper for m in SECRET_MARKERS)


_URL_USERINFO = re.compile(r"(://)[^/@\s]+@")


def redact_value(value: str) -> str:
    """Strip ``user:password@`` from URLs inside a value (e.g. an HF_ENDPOINT with credentials)."""
    return _URL_USERINFO.sub(r"\1<redacted>@", value)


def relevant_env(env: Mapping[str, str]) -> dict[str, str]:
    """The variables that matter, sorted, secret values redacted."""
    out: dict[str, str] = {}
    for name in sorted(env):
        if name.startswith(PREFIXES) or name in NAMES:
            out[name] = REDACTED if is_secret(name) else redact_value(env[name])
    return out
