"""Huawei Ascend NPUs: HCCL collectives, Ray ``NPU`` resources, vllm-ascend rollout, NPU fused attention.

Detection: ``/dev/davinci[0-9]*`` device files; CANN version from
``$ASCEND_HOME_PATH/<arch>-linux/ascend_toolkit_install.info``; driver from
``/usr/local/Ascend/driver/version.info``; NPUs (one per chip: an Atlas A3 NPU has two) and the
processes holding them from ``npu-smi info`` in a child process.
"""

from __future__ import annotations

from typing import Any

from rlctl.platforms.base import Candidate, EngineSettings, Platform, ProbeResult, choose
from rlctl.platforms.kernels import SGLANG_NPU_SOURCE, VLLM_ASCEND_NZ_SOURCE, VLLM_ASCEND_SOURCE
from rlctl.verdict import Check, failed, passed, warned

DEFAULT_TOOLKIT = "/usr/local/Ascend/ascend-toolkit/latest"
NZ_ENV = "VLLM_ASCEND_ENABLE_NZ"


def _key_value(text: str | None, key: str) -> str | None:
    """``version=8.3.RC1`` style lookup (case-insensitive key; quotes around the value dropped)."""
    for line in (text or "").splitlines():
        k, sep, v = line.partition("=")
        if sep and k.strip().lower() == key.lower():
            return v.strip().strip("\"'").strip() or None
    return None


class AscendPlatform(Platform):
    """Ascend NPUs through CPU torch + torch_npu."""

    name = "ascend"
    dist_backend = "hccl"
    ray_resource = "NPU"
    device_type = "npu"
    torch_flavours = ("cpu",)  # torch_npu extends a CPU build of torch
    torch_module = "torch_npu"  # registers torch.npu and the hccl backend
    # SGLang is not an Ascend engine in rlctl (see kernels.SGLANG_NPU_SOURCE): ``auto`` never picks
    # it here and an explicit ``rollout.engine = "sglang"`` is refused before any worker starts
    engine_order = ("vllm", "hf")
    engine_dists = {
        "vllm": ("vllm", "vllm-ascend", "torch-npu"),
        "hf": ("transformers", "torch-npu"),
    }
    unsupported_engines = {"sglang": SGLANG_NPU_SOURCE}
    torch_install = "install the CPU build of torch that your torch_npu was built for"
    driver_fix = "install the Ascend driver and CANN (/dev/davinci* must exist), or choose another platform"
    smi_tool = "npu-smi"
    stack_dists = {"torch-npu": "torch_npu", "vllm-ascend": "vllm_ascend"}
    # vLLM's install order on Ascend is vllm, then vllm-ascend (0.23.0.post1 pins torch==2.10.0
    # where vllm 0.23.0 pins torch==2.11.0): vllm's requirement on what vllm-ascend pins does not count
    overrides = {"vllm": "vllm-ascend"}

    def torch_check(self, build: str) -> Check | None:
        """torch_npu must be installed, and torch must be allowed to load it."""
        npu = self.host.dists.get("torch-npu")
        if npu is None:
            return failed("torch", f"{build}, but torch_npu is not installed", "pip install " + self.torch_npu_requirement(), "torch")
        if self.host.env.get("TORCH_DEVICE_BACKEND_AUTOLOAD") == "0":
            return warned(
                "torch",
                f"{build} + torch_npu {npu.version}, but TORCH_DEVICE_BACKEND_AUTOLOAD=0 stops torch_npu loading",
                "unset TORCH_DEVICE_BACKEND_AUTOLOAD (or import torch_npu explicitly)",
                "torch",
            )
        return passed("torch", f"{build} + torch_npu {npu.version}", "torch")

    def process_line(self, proc: dict[str, Any]) -> str:
        """npu-smi's process table row: NPU, chip, pid, memory."""
        chip = f" chip {proc['chip']}" if "chip" in proc else ""
        mem = f" ({proc['memory_mb']} MB)" if "memory_mb" in proc else ""
        return f"NPU {proc['npu']}{chip} pid {proc['pid']}{mem}"

    def driver_check(self, details: dict[str, Any]) -> Check | None:
        if details.get("cann_version"):
            return None
        return warned("driver", "CANN toolkit not found", "source set_env.sh of the CANN toolkit", "driver", **details)

    def toolkit_home(self) -> str:
        env = self.host.env
        return env.get("ASCEND_HOME_PATH") or env.get("ASCEND_TOOLKIT_HOME") or DEFAULT_TOOLKIT

    def cann_version(self) -> str | None:
        for info in self.host.glob(self.toolkit_home(), "*-linux/ascend_toolkit_install.info"):
            try:
                v = _key_value(info.read_text(encoding="utf-8", errors="replace"), "version")
            except OSError:
                continue
            if v:
                return v
        return None

    def _probe(self) -> ProbeResult:
        h = self.host
        dev_files = [p.name for p in h.glob("/dev", "davinci[0-9]*")]
        details: dict[str, Any] = {
            "device_files": dev_files,
            "cann_version": self.cann_version(),
            "driver_version": _key_value(h.read("/usr/local/Ascend/driver/version.info"), "version"),
        }
        if not dev_files:
            return ProbeResult(False, "no Ascend NPU: no /dev/davinci[0-9]* device files", details)
        smi = h.query_smi("ascend")
        if smi.get("ok"):
            details["devices"] = smi.get("devices", [])
            details["processes"] = smi.get("processes", [])
            details["driver_version"] = details["driver_version"] or smi.get("driver_version")
        else:
            details["smi_error"] = smi.get("error", "unknown error")
            details["devices"] = [{"index": i, "name": f} for i, f in enumerate(dev_files)]
        names = sorted({str(d.get("name")) for d in details["devices"]})
        return ProbeResult(
            True,
            f"{len(details['devices'])} NPU(s) ({', '.join(names)}), {len(dev_files)} x /dev/davinci, "
            f"CANN {details['cann_version'] or 'unknown'}",
            details,
        )

    @property
    def visible_devices_env(self) -> str:
        return "ASCEND_RT_VISIBLE_DEVICES"

    @property
    def ray_noset_env(self) -> str:
        return "RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES"

    def vendor_env(self) -> dict[str, str]:
        """``VLLM_ASCEND_ENABLE_NZ=0``: vllm-ascend defaults it to 1 and its worker's ``wake_up``
        raises while the weight NZ mode is non-zero, so every sleep/wake weight sync would die."""
        return {NZ_ENV: "0"}

    def nz_problem(self, engine_kwargs: dict[str, Any]) -> str | None:
        """Why vllm-ascend would refuse rlctl's wake after a weight sync (None: NZ is off)."""
        extra = engine_kwargs.get("additional_config")
        if isinstance(extra, dict) and "weight_nz_mode" in extra:
            value, where = extra["weight_nz_mode"], "additional_config.weight_nz_mode"
        else:
            value, where = self.rollout_env().get(NZ_ENV, "1"), NZ_ENV
        try:
            on = int(value) != 0
        except (TypeError, ValueError):
            return f"{where} = {value!r} is not an integer (vllm-ascend reads it with int())"
        if not on:
            return None
        return (
            f"{where} = {value}: vllm-ascend's worker wake_up raises 'FRACTAL_NZ mode is enabled' while "
            f"the weight NZ mode is non-zero, and rlctl wakes the engine after every weight sync; set it "
            f"to 0 ({VLLM_ASCEND_NZ_SOURCE})"
        )

    def kernel_problem(self, engine: str, engine_kwargs: dict[str, Any]) -> str | None:
        if engine == "vllm":
            problem = self.nz_problem(engine_kwargs)
            if problem:
                return problem
        return super().kernel_problem(engine, engine_kwargs)

    def engine_install_hint(self, engine: str) -> str:
        if engine == "vllm":
            return (
                "pip install vllm, then vllm-ascend, from one row of the vllm-ascend compatibility matrix "
                "(e.g. vllm==0.23.0 then vllm-ascend==0.23.0.post1 with CANN 9.1.0, Python 3.10-3.12: its "
                "torch==2.10.0 and torch-npu==2.10.0.post4 replace vLLM's torch); not pip install "
                "'rlctl[vllm]', which installs the CUDA wheel"
            )
        if engine == "hf":
            npu = self.torch_npu_requirement()
            missing = [d for d in ("transformers",) if self.host.dists.get(d) is None]
            if self.host.dists.get("torch-npu") is None:
                missing.append(npu)
            return "pip install " + " ".join(missing or ["transformers", npu])
        return super().engine_install_hint(engine)

    def torch_npu_requirement(self) -> str:
        """The torch-npu to install: vllm-ascend's own pins where it is installed (its PKG-INFO,
        e.g. 0.23.0.post1: ``torch==2.10.0``, ``torch-npu==2.10.0.post4``, which win over vLLM's
        torch), else the torch_npu release of the installed torch."""
        plugin = self.host.dists.get("vllm-ascend")
        if plugin is not None:
            pins = [plugin.requirement_on(d) for d in ("torch", "torch-npu")]
            if all(pins):
                return " ".join(f"'{r}'" for r in pins)
        torch = self.host.torch.base_version
        return f"'torch-npu=={torch}.*'" if torch else "torch-npu"

    def engine_settings(self, engine: str) -> EngineSettings:
        """vllm-ascend picks its NPU attention backend itself; rollout runs eager, because ACL graphs
        capture weight addresses and replay stale weights after an RL weight update."""
        if engine == "vllm":
            return EngineSettings(
                "vllm",
                None,
                {"enforce_eager": True},
                env={NZ_ENV: self.rollout_env()[NZ_ENV]},
                reason="vllm-ascend's own NPU backend (AscendAttentionBackend for a decoder model); "
                "enforce_eager = true: ACL graphs replay the weights captured before a sync; "
                f"{NZ_ENV}=0: its wake_up refuses NZ weights",
                source=f"{VLLM_ASCEND_SOURCE}; {VLLM_ASCEND_NZ_SOURCE}",
            )
        if engine == "sglang":
            return EngineSettings(
                "sglang", None, reason="not an Ascend engine in rlctl", source=SGLANG_NPU_SOURCE
            )
        return super().engine_settings(engine)

    def attention_candidates(self) -> list[Candidate]:
        npu = self.host.dists.get("torch-npu")
        if npu is None:
            fa2 = (False, "torch_npu not installed (flash_attention_2 maps to npu_fusion_attention)")
        else:
            # transformers 5.24 modeling_flash_attention_utils.py: the NPU branch comes before any
            # flash_attn import, so an installed flash-attn package is never used here
            fa2 = (True, f"torch_npu {npu.version}: transformers maps it to npu_fusion_attention")
        return choose(
            [
                ("flash_attention_2", *fa2),
                ("sdpa", npu is not None, "torch SDPA on NPU" if npu else "torch_npu not installed"),
                ("eager", True, "plain PyTorch attention, always available"),
            ]
        )

    def supported_dtypes(self) -> list[str]:
        names = [str(d.get("name", "")) for d in self.probe().details.get("devices", [])]
        # Ascend 910A has no bfloat16; 910B/910C (and later) do
        if names and all(n.upper() in ("910", "910A") or n.upper().startswith("910A") for n in names):
            return ["float32", "float16"]
        return ["float32", "float16", "bfloat16"]
