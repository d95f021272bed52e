"""What vLLM and SGLang pick for themselves on each vendor, read from their released source.

The vendor plugins' :meth:`~rlctl.platforms.base.Platform.engine_settings` leave an external
engine's attention kernel to the engine (``kernel=None``) wherever forcing one is known to break
a run, and say what the engine will pick. Every fact here names the wheel file and version it was
read from (``pip download --no-deps <pkg>==<version>``, unzipped):

- vLLM on ROCm never takes ``FLASH_ATTN``: ``vllm/v1/attention/backends/fa_utils.py``
  (0.33.0) ``get_flash_attn_version`` returns None on ROCm and ``FlashAttentionImpl.forward``
  (``flash_attn.py``) asserts "FlashAttention version not detected" in the first forward pass.
- vLLM >= 0.13 checks a forced backend against the model: a forced MHA backend on an MLA model is
  "Selected backend ... is not valid" (0.13.0 ``vllm/platforms/cuda.py``), so the default is
  vLLM's own choice on every vendor.
- SGLang's ``fa3`` asserts SM 8.x (non-MLA) or SM 9.0 (0.5.23
  ``sglang/srt/layers/attention/attention_registry.py`` ``create_flashattention_v3_backend``):
  Blackwell (SM 10/12) dies at start-up with it, so rlctl never forces it.
"""

from __future__ import annotations

from rlctl.platforms.dists import parse_version

VLLM_CUDA_SOURCE = (
    "vllm 0.33.0 vllm/platforms/cuda.py _get_backend_priorities (MHA: FLASH_ATTN, FLASHINFER, "
    "TRITON_ATTN, FLEX_ATTENTION; SM 10: FLASHINFER first); a forced backend fails MLA models from "
    "0.13.0 ('Selected backend ... is not valid', vllm/platforms/cuda.py)"
)
VLLM_ROCM_SOURCE = (
    "vllm 0.33.0 vllm/platforms/rocm.py _get_backend_priorities, same order in 0.23.0 (MHA: ROCM_ATTN, ROCM_AITER_FA "
    "only with aiter MHA enabled, ROCM_AITER_UNIFIED_ATTN, TRITON_ATTN); 0.13.0 vllm/platforms/rocm.py "
    "get_attn_backend_cls (ROCM_AITER_FA with VLLM_ROCM_USE_AITER=1 on gfx9, else TRITON_ATTN); "
    "FLASH_ATTN asserts on ROCm (0.33.0 vllm/v1/attention/backends/fa_utils.py returns no "
    "FlashAttention version there)"
)
VLLM_ROCM_MOE_SOURCE = (
    "vllm 0.33.0 vllm/envs.py (VLLM_ROCM_USE_AITER_MOE defaults to True once VLLM_ROCM_USE_AITER=1), "
    "vllm/model_executor/layers/fused_moe/oracle/unquantized.py convert_to_unquantized_kernel_format "
    "(the AITER backend: rocm_aiter_ops.shuffle_weights of w13/w2 in process_weights_after_loading; "
    "the Triton backend's ROCm padding keeps the values in place)"
)
VLLM_ASCEND_SOURCE = (
    "vllm-ascend 0.23.0.post1 vllm_ascend/platform.py NPUPlatform.get_attn_backend_cls (the plugin "
    "picks its own NPU backend); ACL graphs capture weight addresses, so replays after an RL weight "
    "update read stale weights unless eager (vllm-ascend #7473, #13902)"
)
VLLM_ASCEND_NZ_SOURCE = (
    "vllm-ascend 0.23.0.post1 vllm_ascend/envs.py (VLLM_ASCEND_ENABLE_NZ, default 1), "
    "vllm_ascend/ascend_config.py (weight_nz_mode: additional_config first, else that variable), "
    "vllm_ascend/worker/worker.py NPUWorker.wake_up (raises ValueError while weight_nz_mode != 0); "
    "the same variable and check in 0.13 and 0.18"
)
SGLANG_SOURCE = (
    "sglang 0.5.23 sglang/srt/arg_groups/model_override_base.py get_default_attn_backend (MHA: fa3 on "
    "Hopper, trtllm_mha on SM100/103, aiter on HIP, else flashinfer or triton); fa3 asserts SM 8.x/9.0 "
    "(sglang/srt/layers/attention/attention_registry.py create_flashattention_v3_backend)"
)
SGLANG_HIP_SOURCE = (
    "sglang 0.5.23 sglang/srt/arg_groups/model_override_base.py get_default_attn_backend: 'aiter' "
    "on HIP, whose backend imports the aiter package (sglang/srt/layers/attention/aiter_backend.py); "
    "without a usable aiter rlctl passes attention_backend='triton' as verl's AMD tutorial does"
)
SGLANG_NPU_SOURCE = (
    "sglang 0.5.23 has an NPU backend (sglang/srt/hardware_backend/npu, attention_backend 'ascend'), "
    "but its PyPI wheel is a CUDA 13 build (METADATA: cuda-python>=13.0, flashinfer_python[cu13], "
    "torch==2.14.1) and rlctl's SGLang adapter (torch_memory_saver release/resume) is registered "
    "for NVIDIA and ROCm only"
)


def _release(version: str | None) -> tuple[int, ...]:
    v = parse_version(version)
    return tuple(v.release) if v is not None else ()


def vllm_rocm_pick(vllm_version: str | None, aiter_enabled: bool, priorities_in_source: bool | None) -> str:
    """The backend vLLM picks for a decoder (non-MLA) model on ROCm.

    ``priorities_in_source``: whether the installed ``vllm/platforms/rocm.py`` defines
    ``_get_backend_priorities`` (None: source not readable; the version decides).
    """
    release = _release(vllm_version)  # () for a --hardware target: the newest release read (0.33.0)
    new = priorities_in_source if priorities_in_source is not None else (not release or release >= (0, 23))
    if new:
        return "ROCM_ATTN"  # first of _get_backend_priorities whenever no KV connector is used
    if _release(vllm_version) and _release(vllm_version) <= (0, 13, 99):
        return "ROCM_AITER_FA" if aiter_enabled else "TRITON_ATTN"
    return "vLLM's ROCm default (not modelled for this version)"


def vllm_cuda_pick(compute_capability: tuple[int, int] | None, flashinfer: bool) -> str:
    """The backend vLLM 0.33 picks for a decoder (non-MLA) model on an NVIDIA GPU."""
    if compute_capability is not None and compute_capability[0] == 10 and flashinfer:
        return "FLASHINFER"
    if compute_capability is None or compute_capability >= (8, 0):
        return "FLASH_ATTN"
    return "FLASHINFER" if flashinfer else "TRITON_ATTN"


def sglang_cuda_pick(compute_capability: tuple[int, int] | None, flashinfer: bool) -> str:
    """The backend SGLang 0.5.23 picks for a decoder (non-MLA) model without speculative decoding."""
    if compute_capability is not None and compute_capability[0] == 9:
        return "fa3"
    if compute_capability in ((10, 0), (10, 3)):
        return "trtllm_mha"
    return "flashinfer" if flashinfer else "triton"


def fa3_refusal(compute_capability: tuple[int, int] | None) -> str | None:
    """Why SGLang's ``fa3`` cannot run on this GPU (None: it can, or the GPU is unknown)."""
    if compute_capability is None or compute_capability[0] in (8, 9):
        return None
    major, minor = compute_capability
    return (
        f"SGLang's fa3 backend asserts SM 8.x/9.0 and this GPU is SM {major}.{minor} "
        "(sglang 0.5.23 create_flashattention_v3_backend); leave attention_backend unset"
    )
