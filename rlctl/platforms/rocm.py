"""AMD ROCm: NCCL API over RCCL, Ray ``GPU`` resources, ROCm vLLM / SGLang, CK or aiter kernels.

Detection: ``/sys/module/amdgpu/initstate`` is ``live`` and ``/dev/kfd`` exists; GPU archs come
from the KFD topology in sysfs, the ROCm version from ``/opt/rocm/.info/version``, device names
from pyrsmi in a child process (pyrsmi 1.1.0 ``rocml.py`` loads ``libamd_smi.so`` through ctypes).
rlctl never imports ``amdsmi`` in its own process, but Ray does: Ray 2.60's AMD accelerator
manager counts GPUs through the ``amdsmi`` Python package (``ray/_private/accelerators/amd_gpu.py``
-> ``ray/_private/thirdparty/pyamdsmi/pyamdsmi.py``). Without it Ray reports 0 GPUs; with it on a
host whose ``libamd_smi.so`` cannot be found, ``import ray`` raises ``KeyError: 'libamd_smi.so'``
(amdsmi 7.0.2 ``amdsmi_wrapper.py``). :meth:`RocmPlatform.ray_gpu_check` reads both facts.
"""

from __future__ import annotations

from typing import Any

from rlctl.platforms.base import Candidate, EngineSettings, Platform, ProbeResult, choose
from rlctl.platforms.dists import parse_version
from rlctl.platforms.kernels import SGLANG_HIP_SOURCE, VLLM_ROCM_MOE_SOURCE, VLLM_ROCM_SOURCE, vllm_rocm_pick
from rlctl.verdict import Check, warned

# Ray's shim that wraps amdsmi (Ray 2.60: "import amdsmi" at module level, ImportError caught)
RAY_AMDSMI_SHIM = "ray/_private/thirdparty/pyamdsmi/pyamdsmi.py"
AMDSMI_FIX = (
    "pip install the amdsmi matching your ROCm (pip install /opt/rocm/share/amd_smi, or "
    "pip install amdsmi==<ROCm version>)"
)
CK_ARCHS = ("gfx90a", "gfx942", "gfx950")  # archs the ROCm flash-attn CK backend builds for
AITER_ARCHS = ("gfx942", "gfx950")
FP8_ARCHS = ("gfx942", "gfx950")


def gfx_name(target_version: int) -> str | None:
    """KFD ``gfx_target_version`` -> arch name: 90402 -> gfx942, 90010 -> gfx90a, 0 -> None (CPU)."""
    if target_version <= 0:
        return None
    major, minor, step = target_version // 10000, (target_version // 100) % 100, target_version % 100
    return f"gfx{major}{minor}{step:x}"


class RocmPlatform(Platform):
    """AMD Instinct GPUs through ROCm (HIP) torch."""

    name = "rocm"
    dist_backend = "nccl"  # torch's nccl backend is RCCL in ROCm builds
    ray_resource = "GPU"
    device_type = "cuda"  # ROCm torch exposes HIP devices as torch.cuda
    torch_flavours = ("rocm",)
    engine_order = ("vllm", "sglang", "hf")
    torch_install = "install a ROCm build of torch, e.g. pip install torch --index-url https://download.pytorch.org/whl/rocm6.3"
    driver_fix = "load the amdgpu driver and install ROCm (/dev/kfd must exist), or choose another platform"
    smi_tool = "pyrsmi (pip install 'rlctl[rocm]')"
    tool_dists = ("pyrsmi", "amdsmi")  # the probe's SMI library; Ray's (ray_gpu_check)

    def rocm_path(self) -> str:
        return self.host.env.get("ROCM_PATH") or "/opt/rocm"

    def kfd_gpus(self) -> list[str]:
        """The arch of every GPU node in the KFD topology (CPU nodes have gfx_target_version 0)."""
        gpus: list[str] = []
        for node in self.host.glob("/sys/class/kfd/kfd/topology/nodes", "*/properties"):
            try:
                text = node.read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue
            for line in text.splitlines():
                key, _, value = line.partition(" ")
                if key == "gfx_target_version" and value.strip().isdigit():
                    name = gfx_name(int(value))
                    if name:
                        gpus.append(name)
        return gpus

    def gfx_archs(self) -> list[str]:
        """Distinct GPU archs on this host, in topology order."""
        return list(dict.fromkeys(self.kfd_gpus()))

    def driver_check(self, details: dict[str, Any]) -> Check | None:
        if details.get("rocm_version"):
            return None
        return warned("driver", "ROCm version not found (/opt/rocm/.info/version)", "install ROCm", "driver", **details)

    def _probe(self) -> ProbeResult:
        h = self.host
        state = h.read("/sys/module/amdgpu/initstate")
        kfd = h.exists("/dev/kfd")
        details: dict[str, Any] = {
            "amdgpu_initstate": state,
            "kfd": kfd,
            "rocm_version": h.read(f"{self.rocm_path()}/.info/version"),
            "gfx_archs": self.gfx_archs(),
        }
        if details["rocm_version"]:
            details["rocm_version"] = details["rocm_version"].split("-")[0]
        if state != "live" or not kfd:
            why = []
            if state != "live":
                why.append("amdgpu module not live" if state else "no /sys/module/amdgpu (amdgpu not loaded)")
            if not kfd:
                why.append("no /dev/kfd")
            return ProbeResult(False, "no AMD ROCm GPU: " + ", ".join(why), details)
        smi = h.query_smi("rocm")
        if smi.get("ok") and smi.get("devices"):
            details["devices"] = smi["devices"]
        else:
            details["smi_error"] = smi.get("error") or "pyrsmi found no AMD GPU"
            details["devices"] = [{"index": i, "name": a} for i, a in enumerate(self.kfd_gpus())]
        archs = ", ".join(details["gfx_archs"]) or "unknown arch"
        return ProbeResult(
            True,
            f"amdgpu live, /dev/kfd present, {archs}, ROCm {details['rocm_version'] or 'version unknown'}",
            details,
        )

    def _ray_new(self) -> bool:
        """Ray >= 2.45 uses HIP_VISIBLE_DEVICES (and refuses ROCR_VISIBLE_DEVICES)."""
        v = parse_version(self.host.dists.version("ray"))
        return v is None or v.release >= (2, 45)

    @property
    def visible_devices_env(self) -> str:
        return "HIP_VISIBLE_DEVICES" if self._ray_new() else "ROCR_VISIBLE_DEVICES"

    @property
    def ray_noset_env(self) -> str:
        return f"RAY_EXPERIMENTAL_NOSET_{self.visible_devices_env}"

    def ray_gpu_check(self) -> tuple[str, str, str]:
        """Can the installed Ray count this host's AMD GPUs? ``(status, reason, fix)`` with
        status ok | fail | n/a, read from Ray's own shim and the amdsmi install (nothing imported)."""
        d = self.host.dists
        ray = d.get("ray")
        if ray is None:
            return "n/a", "ray is not installed", ""
        shim = d.locate("ray", RAY_AMDSMI_SHIM)
        try:
            text = shim.read_text(encoding="utf-8", errors="replace") if shim else ""
        except OSError:
            text = ""
        if "import amdsmi" not in text:
            return "ok", f"Ray {ray.version}'s AMD GPU detection does not use the amdsmi package", ""
        amdsmi = d.get("amdsmi")
        if amdsmi is None:
            return (
                "fail",
                f"Ray {ray.version} counts AMD GPUs only through the amdsmi Python package ({RAY_AMDSMI_SHIM}),"
                " which is not installed: Ray reports 0 GPUs and every GPU placement group waits forever",
                AMDSMI_FIX,
            )
        lib = self._libamd_smi()
        if lib is None:
            return (
                "fail",
                f"amdsmi {amdsmi.version} is installed but libamd_smi.so is not under $ROCM_PATH/lib, "
                "$LD_LIBRARY_PATH or the amdsmi package: `import ray` raises KeyError: 'libamd_smi.so'",
                "install ROCm's amd-smi library (amd-smi-lib) or set ROCM_PATH to the ROCm install",
            )
        return "ok", f"Ray {ray.version} counts AMD GPUs through amdsmi {amdsmi.version} ({lib})", ""

    def _libamd_smi(self) -> str | None:
        """Where amdsmi would load libamd_smi.so from (amdsmi 7.0.2 ``find_smi_library`` order)."""
        env = self.host.env
        dirs = [f"{p}/lib" for p in (env.get("ROCM_HOME"), env.get("ROCM_PATH")) if p]
        dirs += [p for p in env.get("LD_LIBRARY_PATH", "").split(":") if p]
        dirs.append(f"{self.rocm_path()}/lib")
        for folder in dirs:
            if self.host.exists(f"{folder}/libamd_smi.so"):
                return f"{folder}/libamd_smi.so"
        bundled = self.host.dists.locate("amdsmi", "amdsmi/libamd_smi.so")
        return str(bundled) if bundled else None

    def engine_install_hint(self, engine: str) -> str:
        if engine == "vllm":
            return (
                "install a ROCm build of vLLM (the rocm/vllm container, or build vLLM from source for "
                "ROCm; the PyPI vllm wheel is CUDA-only)"
            )
        if engine == "sglang":
            return "install a ROCm build of SGLang (the ROCm SGLang container, or build it from source)"
        return super().engine_install_hint(engine)

    def _aiter_usable(self) -> tuple[bool, str]:
        # AMD's aiter is the "amd-aiter" distribution (ROCm/aiter setup.py PACKAGE_NAME); the PyPI
        # project called "aiter" is an unrelated async-iterator library
        aiter = self.host.dists.get("amd-aiter")
        archs = self.probe().details.get("gfx_archs", [])
        if aiter is None:
            return False, "amd-aiter not installed"
        if not archs or not all(a in AITER_ARCHS for a in archs):
            return (
                False,
                f"aiter needs {'/'.join(AITER_ARCHS)}, host has {', '.join(archs) or 'unknown arch'}",
            )
        return True, f"aiter {aiter.version} on {', '.join(archs)}"

    def vendor_env(self) -> dict[str, str]:
        env = {"NCCL_CUMEM_ENABLE": "0"}  # RCCL honours NCCL_* variables; same weight-sync hang
        if self._aiter_usable()[0]:
            # AITER for attention, not for fused MoE: vLLM's AITER MoE shuffles the expert weights
            # after loading (VLLM_ROCM_MOE_SOURCE), so rlctl's in-place load_weights of checkpoint-
            # layout tensors at each sync would leave every expert wrong
            env.update({"VLLM_ROCM_USE_AITER": "1", "VLLM_ROCM_USE_AITER_MOE": "0", "SGLANG_USE_AITER": "1"})
        return env

    def attention_candidates(self) -> list[Candidate]:
        torch_rocm = self.host.torch.flavour == "rocm"
        no_torch = f"torch is a {self.host.torch.flavour} build, not ROCm"
        fa = self.host.dists.get("flash-attn")
        archs = self.probe().details.get("gfx_archs", [])
        triton = self.host.env.get("FLASH_ATTENTION_TRITON_AMD_ENABLE", "").upper() == "TRUE"
        if fa is None:
            fa2 = (False, "ROCm flash-attn not installed")
        elif not torch_rocm:
            fa2 = (False, no_torch)
        elif triton:
            fa2 = (
                True,
                f"flash-attn {fa.version}, Triton AMD backend (FLASH_ATTENTION_TRITON_AMD_ENABLE=TRUE)",
            )
        elif archs and all(a in CK_ARCHS for a in archs):
            fa2 = (True, f"flash-attn {fa.version}, CK backend on {', '.join(archs)}")
        else:
            fa2 = (
                False,
                f"CK backend supports {'/'.join(CK_ARCHS)}; set FLASH_ATTENTION_TRITON_AMD_ENABLE=TRUE",
            )
        return choose(
            [
                ("flash_attention_2", *fa2),
                ("sdpa", torch_rocm, "torch SDPA on ROCm" if torch_rocm else no_torch),
                ("eager", True, "plain PyTorch attention, always available"),
            ]
        )

    def vllm_backend_pick(self) -> str:
        """The attention backend the installed vLLM picks for a decoder model on this host."""
        source = self.host.dists.locate("vllm", "vllm/platforms/rocm.py")
        try:
            text = source.read_text(encoding="utf-8", errors="replace") if source else None
        except OSError:
            text = None
        in_source = None if text is None else "def _get_backend_priorities" in text
        aiter = self.rollout_env().get("VLLM_ROCM_USE_AITER", "0").lower() in ("1", "true")
        return vllm_rocm_pick(self.host.dists.version("vllm"), aiter, in_source)

    def engine_settings(self, engine: str) -> EngineSettings:
        """vLLM keeps its own choice (never FLASH_ATTN); SGLang its aiter default where aiter runs,
        else ``triton`` (SGLang's HIP default imports aiter)."""
        env = self.rollout_env()
        if engine == "vllm":
            return EngineSettings(
                "vllm",
                None,
                env={k: v for k, v in env.items() if k.startswith("VLLM_")},
                reason=f"vLLM's own choice: {self.vllm_backend_pick()} for a decoder model (FLASH_ATTN never forced)",
                source=VLLM_ROCM_SOURCE,
            )
        if engine == "sglang":
            aiter_ok, why = self._aiter_usable()
            if aiter_ok:
                return EngineSettings(
                    "sglang",
                    None,
                    env={k: v for k, v in env.items() if k.startswith("SGLANG_")},
                    reason=f"SGLang's own choice: aiter ({why})",
                    source=SGLANG_HIP_SOURCE,
                )
            return EngineSettings(
                "sglang",
                "triton",
                {"attention_backend": "triton"},
                reason=f"triton: SGLang's HIP default aiter cannot run here ({why})",
                source=SGLANG_HIP_SOURCE,
            )
        return super().engine_settings(engine)

    def kernel_problem(self, engine: str, engine_kwargs: dict[str, Any]) -> str | None:
        env = self.rollout_env()
        on = lambda k: env.get(k, "").lower() in ("1", "true")  # noqa: E731 (vllm/envs.py parsing)
        if engine == "vllm" and on("VLLM_ROCM_USE_AITER") and on("VLLM_ROCM_USE_AITER_MOE"):
            return (
                "VLLM_ROCM_USE_AITER_MOE=1 with VLLM_ROCM_USE_AITER=1: vLLM's AITER fused MoE shuffles "
                "the expert weights after loading and rlctl's weight sync loads checkpoint-layout "
                f"tensors in place, so every expert would be wrong after the first sync ({VLLM_ROCM_MOE_SOURCE}); "
                "unset it (rlctl sets 0: AITER attention, Triton fused MoE)"
            )
        if engine == "vllm":
            config = engine_kwargs.get("attention_config")
            backend = config.get("backend") if isinstance(config, dict) else None
            if "FLASH_ATTN" in (backend, engine_kwargs.get("attention_backend")):
                return (
                    "vLLM's FLASH_ATTN backend cannot run on ROCm: fa_utils.get_flash_attn_version returns "
                    "None there and FlashAttentionImpl.forward asserts 'FlashAttention version not "
                    "detected' (vllm 0.33.0 vllm/v1/attention/backends/fa_utils.py); leave the backend "
                    f"unset (vLLM picks {self.vllm_backend_pick()})"
                )
        if engine == "sglang" and engine_kwargs.get("attention_backend") == "aiter":
            aiter_ok, why = self._aiter_usable()
            if not aiter_ok:
                return f"SGLang's aiter backend imports the aiter package, which cannot run here ({why})"
        return super().kernel_problem(engine, engine_kwargs)

    def rollout_attention_candidates(self) -> list[Candidate]:
        """vLLM attention backends on ROCm in the installed vLLM's order (FLASH_ATTN never runs)."""
        aiter_ok, aiter_why = self._aiter_usable()
        pick = self.vllm_backend_pick()
        order = ["ROCM_ATTN", "ROCM_AITER_FA", "TRITON_ATTN"]
        if pick in order:
            order.remove(pick)
            order.insert(0, pick)
        why = {
            "ROCM_ATTN": (True, "vLLM's ROCm paged attention"),
            "ROCM_AITER_FA": (aiter_ok, aiter_why + (" (VLLM_ROCM_USE_AITER=1)" if aiter_ok else "")),
            "TRITON_ATTN": (True, "Triton attention, portable"),
        }
        options = [(name, *why[name]) for name in order]
        options.append(("FLASH_ATTN", False, "asserts on ROCm: no FlashAttention version (fa_utils.py)"))
        return choose(options)

    def supported_dtypes(self) -> list[str]:
        archs = self.probe().details.get("gfx_archs", [])
        out = ["float32", "float16", "bfloat16"]
        if archs and all(a in FP8_ARCHS for a in archs):
            out.append("float8_e4m3fnuz" if "gfx942" in archs else "float8_e4m3fn")
        return out
