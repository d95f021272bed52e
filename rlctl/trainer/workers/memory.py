"""Each worker's peak memory, reported to the driver as ``memory/<role>_peak_gib`` so the plan's
prediction (``rlctl plan``) can be read against what the run really used.

On CPU the figure is the worker process's peak resident set (``getrusage`` ``ru_maxrss``, the
kernel's VmHWM): everything the process ever held at once, the Python/torch baseline included. On
an accelerator it is the allocator's peak (the platform's runtime half,
``DeviceRuntime.peak_memory_bytes``): the tensors only, as the plan models them.
"""

from __future__ import annotations

import resource
import sys

from rlctl.dispatch import Dispatch, register

GIB = float(1 << 30)


def host_peak_rss_bytes() -> int:
    """This process's peak resident set in bytes (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024


class PeakMemory:
    """Mixed into a ``Worker``: its ``device_runtime`` is the platform's runtime half."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def peak_memory(self) -> dict[str, float]:
        """``{"host_gib": ..., "device_gib": ...}`` (device only off CPU) for this rank."""
        out = {"host_gib": host_peak_rss_bytes() / GIB}
        device = self.device_runtime.peak_memory_bytes()  # type: ignore[attr-defined]
        if device is not None:
            out["device_gib"] = device / GIB
        return out
