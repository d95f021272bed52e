"""``memory/<role>_peak_gib``: each role's peak over its ranks, as the workers report it.

The figure is the device allocator's peak where the role runs on an accelerator, else the worker
process's peak resident set (see :mod:`rlctl.trainer.workers.memory`); ``memory/<role>_host_peak_gib``
is always the host side. Read them against ``RUN_DIR/plan.json`` (``rlctl plan``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def peak_memory_metrics(groups: Mapping[str, Any]) -> dict[str, float]:
    """One ``memory/*`` pair per role of ``groups`` (``{role: WorkerGroup or None}``)."""
    out: dict[str, float] = {}
    for role, group in groups.items():
        if group is None:
            continue
        ranks = group.peak_memory()
        host = max(r["host_gib"] for r in ranks)
        devices = [r["device_gib"] for r in ranks if "device_gib" in r]
        out[f"memory/{role}_peak_gib"] = max(devices) if devices else host
        out[f"memory/{role}_host_peak_gib"] = host
    return out
