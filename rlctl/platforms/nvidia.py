"""NVIDIA CUDA: NCCL collectives, Ray ``GPU`` resources, vLLM / SGLang rollout, FlashAttention.

Detection reads the kernel module and device files, then asks NVML (nvidia-ml-py) in a child
process for driver, CUDA driver version and devices. A container started without GPU access
still sees the host's ``/sys/module/nvidia`` but has no ``/dev/nvidia[0-9]*`` and no
``libnvidia-ml.so.1`` (NVML_ERROR_LIBRARY_NOT_FOUND = 12): that is "not found", with a hint.
"""

from __future__ import annotations

from typing import Any

from rlctl.platforms.base import Candidate, EngineSettings, Platform, ProbeResult, choose
from rlctl.platforms.kernels import (
    SGLANG_SOURCE,
    VLLM_CUDA_SOURCE,
    fa3_refusal,
    sglang_cuda_pick,
    vllm_cuda_pick,
)

# NVML error codes worth a specific hint (nvml.h; nvidia-ml-py pynvml.py NVML_ERROR_* constants)
NVML_HINTS = {
    4: "no permission to the NVIDIA device files",
    9: "the NVIDIA kernel driver is not loaded",
    12: "libnvidia-ml.so.1 not found: driver not installed or not mounted into the container",
    18: "driver/library version mismatch: the driver was upgraded under a running module; reboot",
}


class NvidiaPlatform(Platform):
    """NVIDIA GPUs through CUDA torch."""

    name = "nvidia"
    dist_backend = "nccl"
    ray_resource = "GPU"
    device_type = "cuda"
    torch_flavours = ("cuda",)
    engine_order = ("vllm", "sglang", "hf")
    torch_install = "install a CUDA build of torch, e.g. pip install torch --index-url https://download.pytorch.org/whl/cu128"
    driver_fix = "install/load the NVIDIA driver (nvidia-smi must work), or choose another platform with RLCTL_PLATFORM"
    smi_tool = "nvidia-ml-py"
    tool_dists = ("nvidia-ml-py",)

    def _probe(self) -> ProbeResult:
        h = self.host
        module = h.exists("/sys/module/nvidia") or h.exists("/proc/driver/nvidia/version")
        dev_files = [p.name for p in h.glob("/dev", "nvidia[0-9]*")]
        wsl = h.exists("/dev/dxg") and h.exists("/usr/lib/wsl/lib/libnvidia-ml.so.1")
        details: dict[str, Any] = {"device_files": dev_files, "kernel_module": module}
        if not (module or dev_files or wsl):
            return ProbeResult(
                False,
                "no NVIDIA driver: /sys/module/nvidia and /proc/driver/nvidia absent, no /dev/nvidia[0-9]*",
                details,
            )
        smi = h.query_smi("nvidia")
        if not smi.get("ok"):
            err = smi.get("error", "unknown error")
            hint = NVML_HINTS.get(smi.get("code", -1), "")
            details["smi_error"] = err + (f" ({hint})" if hint else "")
            if not dev_files and not wsl:
                # the host's module shows through /sys, but this process has no GPU: a container
                # started without --gpus / the NVIDIA Container Toolkit, or a driver not loaded
                details["near_miss"] = (
                    "the NVIDIA kernel module is visible but there is no /dev/nvidia[0-9]* and NVML "
                    f"failed ({err}): a container without GPU access?"
                )
                details["near_miss_fix"] = (
                    "start the container with GPU access (docker run --gpus all, or the NVIDIA "
                    "Container Toolkit / device plugin), or set RLCTL_PLATFORM=cpu to run on CPU"
                )
                return ProbeResult(
                    False,
                    f"no usable NVIDIA GPU: kernel module visible but no /dev/nvidia[0-9]* and NVML "
                    f"failed: {details['smi_error']}",
                    details,
                )
            return ProbeResult(
                True, f"NVIDIA driver files present but NVML failed: {details['smi_error']}", details
            )
        details.update({k: smi[k] for k in ("driver_version", "cuda_driver", "devices") if k in smi})
        devs = smi.get("devices", [])
        if not devs:
            return ProbeResult(
                False, f"NVIDIA driver {smi.get('driver_version')} loaded but NVML sees 0 GPUs", details
            )
        names = sorted({d.get("name", "?") for d in devs})
        return ProbeResult(
            True,
            f"NVML: {len(devs)} x {', '.join(names)}, driver {smi.get('driver_version')} "
            f"(CUDA {smi.get('cuda_driver')})",
            details,
        )

    @property
    def visible_devices_env(self) -> str:
        return "CUDA_VISIBLE_DEVICES"

    @property
    def ray_noset_env(self) -> str:
        return "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"

    def vendor_env(self) -> dict[str, str]:
        # cuMem allocations can make NCCL weight sync into vLLM/SGLang hang (verl constants); a
        # value the user set wins (verl#7564: GB300-class systems run with NCCL_CUMEM_ENABLE=1)
        return {"NCCL_CUMEM_ENABLE": "0"}

    def engine_install_hint(self, engine: str) -> str:
        """PyPI's vllm 0.33.0 and sglang 0.5.23 wheels are CUDA 13 builds (sglang METADATA:
        cuda-python>=13.0; vllm's cumem allocator links libnvrtc.so.13) that need driver >= 580."""
        cuda = str(self.probe().details.get("cuda_driver") or "")
        if engine in ("vllm", "sglang") and cuda and int(cuda.split(".")[0]) < 13:
            return (
                f"pip install 'rlctl[{engine}]' installs {engine}'s CUDA 13 wheel, which this driver "
                f"(CUDA {cuda}) cannot run: upgrade the NVIDIA driver to >= 580, or install {engine}'s "
                "CUDA 12 build (its install docs) with the torch it pins"
            )
        return super().engine_install_hint(engine)

    def compute_capability(self) -> tuple[int, int] | None:
        """Lowest compute capability among the GPUs NVML reported (None when unknown)."""
        ccs = [
            tuple(d["compute_capability"])
            for d in self.probe().details.get("devices", [])
            if "compute_capability" in d
        ]
        return min(ccs) if ccs else None  # type: ignore[return-value]

    def attention_candidates(self) -> list[Candidate]:
        torch_cuda = self.host.torch.flavour == "cuda"
        cc = self.compute_capability()
        cc_txt = f"sm{cc[0]}{cc[1]}" if cc else "unknown compute capability"
        fa2 = self.host.dists.get("flash-attn")
        fa3 = self.host.dists.get("flash-attn-3") or self.host.dists.get("flash_attn_3")
        no_torch = f"torch is a {self.host.torch.flavour} build, not CUDA"

        def fa(dist: Any, dist_name: str, name: str, ok_cc: bool, need: str) -> tuple[str, bool, str]:
            if dist is None:
                return (
                    name,
                    False,
                    f"{dist_name} package not installed",
                )
            if not torch_cuda:
                return (name, False, no_torch)
            if not ok_cc:
                return (name, False, f"needs {need}, GPU is {cc_txt}")
            return (name, True, f"flash-attn {dist.version} on {cc_txt}")

        return choose(
            [
                fa(
                    fa2,
                    "flash-attn",
                    "flash_attention_2",
                    cc is not None and cc >= (8, 0),
                    "sm80+ (Ampere or newer)",
                ),
                fa(fa3, "flash-attn-3", "flash_attention_3", cc is not None and cc[0] == 9, "sm90 (Hopper)"),
                ("sdpa", torch_cuda, "torch SDPA (flash/mem-efficient kernels)" if torch_cuda else no_torch),
                ("eager", True, "plain PyTorch attention, always available"),
            ]
        )

    def engine_settings(self, engine: str) -> EngineSettings:
        """vLLM and SGLang keep their own attention choice on NVIDIA (see :mod:`.kernels`)."""
        cc = self.compute_capability()
        fi = self.host.dists.get("flashinfer-python") is not None
        if engine == "vllm":
            return EngineSettings(
                "vllm",
                None,
                reason=f"vLLM's own choice: {vllm_cuda_pick(cc, fi)} for a decoder model",
                source=VLLM_CUDA_SOURCE,
            )
        if engine == "sglang":
            return EngineSettings(
                "sglang",
                None,
                reason=f"SGLang's own choice: {sglang_cuda_pick(cc, fi)} for a decoder model (fa3 never forced)",
                source=SGLANG_SOURCE,
            )
        return super().engine_settings(engine)

    def kernel_problem(self, engine: str, engine_kwargs: dict) -> str | None:
        if engine == "sglang" and engine_kwargs.get("attention_backend") == "fa3":
            return fa3_refusal(self.compute_capability())
        return super().kernel_problem(engine, engine_kwargs)

    def rollout_attention_candidates(self) -> list[Candidate]:
        """vLLM attention backends on NVIDIA in vLLM 0.33's order for this GPU (FLASHINFER first on
        SM 10: ``_get_backend_priorities``), so the chosen one is :func:`vllm_cuda_pick`'s."""
        cc = self.compute_capability()
        fi = self.host.dists.get("flashinfer-python")
        options = [
            ("FLASH_ATTN", cc is None or cc >= (8, 0), "vLLM's FlashAttention kernels (sm80+)"),
            (
                "FLASHINFER",
                fi is not None,
                f"flashinfer {fi.version}" if fi else "flashinfer-python not installed",
            ),
            ("TRITON_ATTN", True, "Triton attention, portable"),
            ("FLEX_ATTENTION", True, "torch flex attention"),
        ]
        if cc is not None and cc[0] == 10:  # vLLM 0.33's SM 10 priorities: FLASHINFER, FLASH_ATTN, ...
            options[0], options[1] = options[1], options[0]
        return choose(options)

    def supported_dtypes(self) -> list[str]:
        cc = self.compute_capability()
        out = ["float32", "float16"]
        if cc is not None and cc >= (8, 0):
            out.append("bfloat16")
        if cc is not None and cc >= (8, 9):
            out.append("float8_e4m3fn")
        return out
