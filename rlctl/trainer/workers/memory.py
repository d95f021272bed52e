"""Each worker's peak memory, reported to the driver as ``memory/<role>_peak_gib`` so the plan's
prediction (``rlctl plan``) can be read against what the run really used.

On CPU the figure is the worker process's peak resident set (``getrusage`` ``ru_maxrss``, the
kernel's VmHWM): everything the process ever held at once, the Python/torch baseline included. On
an accelerator it is the allocator's peak (``torch.<device>.max_memory_allocated``): the tensors
only, as the plan models them.
"""

from __future__ import annotations

import resource
import sys

import torch

from rlctl.dispatch import Dispatch, register

GIB = float(1 << 30)


def host_peak_rss_bytes() -> int:
    """This process's peak resident set in bytes (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024


def device_peak_bytes(device_type: str) -> int | None:
    """The allocator's peak on ``device_type`` (cuda, npu, xpu, ...); None on CPU or when the
    device module keeps no statistics."""
    if device_type == "cpu":
        return None
    module = getattr(torch, device_type, None)
    peak = getattr(module, "max_memory_allocated", None)
    if peak is None:
        return None
    return int(peak())


class PeakMemory:
    """Mixed into a worker whose ``spec.engine.device_type`` names its device."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def peak_memory(self) -> dict[str, float]:
        """``{"host_gib": ..., "device_gib": ...}`` (device only off CPU) for this rank."""
        out = {"host_gib": host_peak_rss_bytes() / GIB}
        device = device_peak_bytes(self.spec.engine.device_type)  # type: ignore[attr-defined]
        if device is not None:
            out["device_gib"] = device / GIB
        return out
