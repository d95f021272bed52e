"""What a parity report was measured on: the case a profile resolves to and the machine's record.

A case is one model on one device with the kernels and engines the profile's platform picks
(``rlctl train`` resolves the same: :mod:`rlctl.trainer.plan.choices`). The environment record
names the device, its driver and the library versions, so two machines' JSON reports can be put
side by side (``rlctl bench parity --compare``).
"""

from __future__ import annotations

import os
import platform as pyplatform
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path

import torch

from rlctl.devices import runtime_of
from rlctl.errors import UserError

REPO = Path(__file__).resolve().parents[2]
DEFAULT_PROFILES = ("profiles/tiny-cpu.toml", "profiles/smollm2-cpu.toml")
LIBRARIES = ("torch", "transformers", "vllm", "vllm-ascend", "sglang", "flash-attn", "torch-npu", "rlctl")


@dataclass(frozen=True)
class ParityCase:
    """One model on one device: what the bench builds for it."""

    name: str
    model_path: str
    device: str
    platform: str
    attn_implementation: str
    rollout_engine: str
    lr: float
    weight_decay: float
    # what the rollout engine is built with (the platform's engine settings, as rlctl train does)
    rollout_kwargs: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def default_profiles() -> list[Path]:
    """The built-in tiny model's profile, and SmolLM2's once its model is imported."""
    from rlctl.profile import load_profile

    out = []
    for rel in DEFAULT_PROFILES:
        path = REPO / rel
        if path.is_file() and (Path(load_profile(path).model.path) / "config.json").is_file():
            out.append(path)
    return out


def resolve_case(profile_path: str | Path, device: str | None = None) -> ParityCase:
    """The case ``profile_path`` resolves to on this host; ``device`` overrides the platform's
    (the rollout engine then falls back to HF unless the platform's one runs there)."""
    from rlctl.engines.registry import get_engine
    from rlctl.profile import load_profile
    from rlctl.trainer.plan import choices

    profile = load_profile(profile_path)
    if not (Path(profile.model.path) / "config.json").is_file():
        raise UserError(
            f"{profile.source}: model.path: {profile.model.path} holds no model (import or build it first)"
        )
    platform = choices.usable_platform(profile)
    engine = choices.rollout_engine(profile, platform)
    attn = profile.platform.attention if profile.platform.attention != "auto" else platform.attention_impl()
    dev = device or platform.device_type
    if dev.split(":")[0] != platform.device_type:
        try:
            get_engine("rollout", "*", engine, dev.split(":")[0], platform.name)
        except UserError:  # the platform's engine is not built for this device: HF runs anywhere
            engine = "hf"
        attn = "sdpa" if dev.startswith("cpu") else attn
    if engine == "hf":
        rollout_kwargs: dict = {"attn_implementation": attn}
    else:
        from rlctl.engines.engine_fields import resolve_engine_kwargs

        where = f"{profile.source}: rollout.engine_kwargs"
        rollout_kwargs = resolve_engine_kwargs(platform, engine, profile.rollout.engine_kwargs, where=where)
    return ParityCase(
        name=Path(profile.model.path).name,
        model_path=str(profile.model.path),
        device=dev,
        platform=platform.name,
        attn_implementation=attn,
        rollout_engine=engine,
        lr=profile.actor.lr,
        weight_decay=profile.actor.weight_decay,
        rollout_kwargs=rollout_kwargs,
    )


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return pyplatform.processor() or pyplatform.machine()


def environment(device: str) -> dict:
    """Device name, driver/runtime, core count, library versions and torch's numeric settings."""
    dev = torch.device(device)
    record: dict = {
        "device": str(dev),
        "device_name": _cpu_name(),
        "cpu": _cpu_name(),
        "cpu_cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": pyplatform.python_version(),
        "os": f"{pyplatform.system()} {pyplatform.release()}",
        "libraries": {d: v for d in LIBRARIES if (v := _version(d)) is not None},
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "driver": None,
    }
    if dev.type == "cuda" and torch.cuda.is_available():
        record["device_name"] = torch.cuda.get_device_name(dev)
        record["capability"] = list(torch.cuda.get_device_capability(dev))
        record["driver"] = {"cuda_runtime": torch.version.cuda, "hip": getattr(torch.version, "hip", None)}
        record["tf32_matmul"] = torch.backends.cuda.matmul.allow_tf32
        record["sdpa_backends"] = {
            "flash": torch.backends.cuda.flash_sdp_enabled(),
            "mem_efficient": torch.backends.cuda.mem_efficient_sdp_enabled(),
            "math": torch.backends.cuda.math_sdp_enabled(),
        }
        version = Path("/proc/driver/nvidia/version")
        if version.is_file():
            record["driver"]["nvidia"] = version.read_text().splitlines()[0].strip()
    elif dev.type != "cpu":
        name = getattr(runtime_of(dev).module, "get_device_name", None)
        record["device_name"] = name(dev) if name else dev.type
    return record
