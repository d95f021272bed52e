"""A ``--hardware`` target as a host: what a probe of a real host of that device would read.

``rlctl plan --hardware b200:8`` must name the kernels a run on a B200 host picks, so the target
platform answers through the same code as on a real host: its probe details hold the catalogue's
compute capability (NVIDIA) or gfx arch (ROCm) and the device's memory in the vendor tool's unit,
and its installed distributions are a supported install of the vendor's torch build plus every
rollout engine the platform runs, each with the packages that engine's own wheel requires (so
``rollout.engine = auto`` picks as on a host with all of them, through the same code as a run):

- vllm 0.33.0 METADATA ``Requires-Dist: flashinfer-python==0.7.2.post1`` (its CUDA build);
- sglang 0.5.23 METADATA ``Requires-Dist: flashinfer_python[cu13]==0.7.2``;
- Ascend: torch_npu is part of the platform's torch (CPU torch + torch_npu), vLLM runs with
  vllm-ascend.

Nothing optional is assumed (flash-attn, ROCm's aiter): a run whose host has them picks what
``rlctl doctor`` on that host shows. Versions are unknown (None); the engines' picks are those of
the newest releases read (:mod:`rlctl.platforms.kernels`).
"""

from __future__ import annotations

from pathlib import Path

from rlctl.platforms.base import Platform, ProbeResult
from rlctl.platforms.catalogue import DeviceSpec
from rlctl.platforms.dists import Dist, DistIndex, TorchBuild
from rlctl.platforms.host import Host

# rollout engine -> the distributions its wheel brings, per platform
ENGINE_INSTALL: dict[str, dict[str, tuple[str, ...]]] = {
    "nvidia": {"vllm": ("vllm", "flashinfer-python"), "sglang": ("sglang", "flashinfer-python")},
    "rocm": {"vllm": ("vllm",), "sglang": ("sglang",)},
    "ascend": {"vllm": ("vllm", "vllm-ascend")},
}
PLATFORM_INSTALL: dict[str, tuple[str, ...]] = {
    "nvidia": ("torch", "transformers"),
    "rocm": ("torch", "transformers"),
    "ascend": ("torch", "torch-npu", "transformers"),
}


def target_host(device: DeviceSpec, torch_flavour: str) -> Host:
    """A host with the vendor's torch build, the platform's packages and every rollout engine's
    (no files, no versions: every distribution is present with an unknown version; no user
    environment, so the workers' vendor variables are rlctl's defaults)."""
    host = Host(root=Path("/nonexistent-plan-target"), env={}, path=[], smi=lambda vendor: {"ok": False})
    names = PLATFORM_INSTALL.get(device.platform, ("torch", "transformers"))
    for engine_names in ENGINE_INSTALL.get(device.platform, {}).values():
        names += tuple(n for n in engine_names if n not in names)
    index = DistIndex([])
    index._by_name = {n: Dist(name=n, version="", requires=(), location="") for n in names}
    host.__dict__["dists"] = index
    host.__dict__["torch"] = TorchBuild(version=None, flavour=torch_flavour, source="target: assumed")
    return host


def target_probe(device: DeviceSpec, count: int) -> ProbeResult:
    """What the platform's probe reads on a host of ``count`` x ``device``."""
    dev = {"name": device.name, "memory_total": device.memory_bytes}
    details: dict = {"target": True}
    if device.platform == "nvidia" and device.arch:
        major, _, minor = device.arch.partition(".")
        dev["compute_capability"] = (int(major), int(minor or 0))
    if device.platform == "rocm" and device.arch:
        details["gfx_archs"] = [device.arch] * count
    details["devices"] = [{**dev, "index": i} for i in range(count)]
    arch = f", {device.arch}" if device.arch else ""
    return ProbeResult(True, f"target: {count} x {device.name}{arch}", details)


def describe_target(platform: Platform, device: DeviceSpec, count: int) -> Platform:
    """``platform`` answering as on a host of ``count`` x ``device`` (its probe is the target's)."""
    platform._probe_result = target_probe(device, count)
    return platform
