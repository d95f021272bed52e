"""Vendor SMI queries, always run in a child process with a timeout.

Why a child process: vendor libraries misbehave on hosts without their hardware (``import amdsmi``
prints to stdout and raises KeyError, NVML can hang on a wedged driver). Whatever happens in the
child, the parent gets a dict: ``{"ok": True, ...}`` or ``{"ok": False, "error": "..."}``.

The parsing functions take the vendor module as an argument, so tests feed them fakes shaped
after the real APIs (nvidia-ml-py's ``pynvml``, pyrsmi's ``rocml``) and the text of ``npu-smi info``.
Run as ``python -m rlctl.platforms.smi nvidia|rocm|ascend``; it prints one JSON line.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import sys
from typing import Any

SMI_TIMEOUT_S = 15.0


def _text(value: Any) -> str:
    """Older nvidia-ml-py returns ``bytes`` for strings."""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


def _error(exc: BaseException) -> dict[str, Any]:
    out: dict[str, Any] = {"ok": False, "error": f"{type(exc).__name__}: {exc}".strip()}
    code = getattr(exc, "value", None)
    if isinstance(code, int):
        out["code"] = code
    return out


def query_nvml(nv: Any) -> dict[str, Any]:
    """Driver, CUDA driver version and devices through an nvidia-ml-py style module ``nv``."""
    try:
        nv.nvmlInit()
    except Exception as exc:
        return _error(exc)
    try:
        cuda_int = int(nv.nvmlSystemGetCudaDriverVersion())
        devices = []
        for i in range(int(nv.nvmlDeviceGetCount())):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            dev: dict[str, Any] = {"index": i, "name": _text(nv.nvmlDeviceGetName(h))}
            try:
                dev["memory_total"] = int(nv.nvmlDeviceGetMemoryInfo(h).total)
            except Exception as exc:
                dev["memory_error"] = _error(exc)["error"]
            try:
                major, minor = nv.nvmlDeviceGetCudaComputeCapability(h)
                dev["compute_capability"] = [int(major), int(minor)]
            except Exception as exc:
                dev["cc_error"] = _error(exc)["error"]
            devices.append(dev)
        return {
            "ok": True,
            "driver_version": _text(nv.nvmlSystemGetDriverVersion()),
            "cuda_driver_version": cuda_int,
            "cuda_driver": f"{cuda_int // 1000}.{(cuda_int % 1000) // 10}",
            "devices": devices,
        }
    except Exception as exc:
        return _error(exc)
    finally:
        with contextlib.suppress(Exception):
            nv.nvmlShutdown()


def query_rocml(rocml: Any) -> dict[str, Any]:
    """Devices through pyrsmi's ``rocml`` (its getters return -1 or '' instead of raising)."""
    try:
        rocml.smi_initialize()
    except Exception as exc:
        return _error(exc)
    try:
        count = int(rocml.smi_get_device_count())
        if count < 0:
            return {"ok": False, "error": f"smi_get_device_count returned {count}"}
        devices = []
        for i in range(count):
            name = _text(rocml.smi_get_device_name(i))
            mem = int(rocml.smi_get_device_memory_total(i))
            dev: dict[str, Any] = {"index": i, "name": name or "unknown"}
            if mem >= 0:
                dev["memory_total"] = mem
            devices.append(dev)
        return {"ok": True, "devices": devices}
    except Exception as exc:
        return _error(exc)
    finally:
        with contextlib.suppress(Exception):
            rocml.smi_shutdown()


_NPU_VERSION = re.compile(r"Version:\s*([0-9A-Za-z.\-]+)")
_BUS_ID = re.compile(r"^[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f]$")
_INT_WORDS = re.compile(r"^(\d+)(?:\s+(\d+))?$")


def _cells(line: str) -> list[str]:
    """``| a | b |`` -> ``["a", "b"]`` (table borders and blank cells kept as "")."""
    return [c.strip() for c in line.strip().strip("|").split("|")]


def parse_npu_smi(text: str) -> dict[str, Any]:
    """Parse ``npu-smi info``: the driver version, one entry per NPU chip, and the process table.

    The device table has two rows per chip: ``NPU Name | Health`` then ``Chip [Phy-ID] | Bus-Id``.
    On Atlas A2 (910B) each NPU has one chip; on Atlas A3 each NPU id is printed once per chip
    (two chips, each its own ``/dev/davinciN`` and Phy-ID). After the device table comes a process
    table (``NPU Chip | Process id | Process name | Process memory(MB)``) whose rows must not count
    as devices. Layouts recorded from npu-smi 25.2.0 (910B3, vllm-project/vllm-ascend#6512) and
    npu-smi 25.2.3 (A3 "Ascend910", vllm-project/vllm-ascend#4930); see tests/platforms/fakes.py.
    """
    version = _NPU_VERSION.search(text)
    devices: list[dict[str, Any]] = []
    processes: list[dict[str, Any]] = []
    pending: dict[str, Any] | None = None  # the "NPU Name | Health" row waiting for its chip row
    in_processes = False
    for line in text.splitlines():
        if not line.strip().startswith("|"):
            continue
        cells = _cells(line)
        if any("Process id" in c for c in cells):
            in_processes, pending = True, None
            continue
        if len(cells) < 2:
            continue
        if in_processes:
            ids = _INT_WORDS.match(cells[0])
            if ids and len(cells) >= 4 and cells[1].isdigit():
                proc: dict[str, Any] = {"npu": int(ids.group(1)), "pid": int(cells[1]), "name": cells[2]}
                if ids.group(2) is not None:
                    proc["chip"] = int(ids.group(2))
                mem = cells[3].split()[0] if cells[3].split() else ""
                if mem.isdigit():
                    proc["memory_mb"] = int(mem)
                processes.append(proc)
            continue
        first = cells[0].split()
        if _BUS_ID.match(cells[1]) and pending is not None and first and first[0].isdigit():
            dev = {"index": len(devices), **pending, "chip": int(first[0]), "bus_id": cells[1]}
            if len(first) > 1 and first[1].isdigit():
                dev["phy_id"] = int(first[1])
            devices.append(dev)
            pending = None
        elif len(first) >= 2 and first[0].isdigit() and not first[1].isdigit() and cells[1]:
            pending = {"npu": int(first[0]), "name": first[1], "health": cells[1]}
    if not devices:
        return {"ok": False, "error": "npu-smi info listed no NPU", "raw_head": text[:200]}
    return {
        "ok": True,
        "driver_version": version.group(1) if version else None,
        "devices": devices,
        "processes": processes,
    }


def _main_nvidia() -> dict[str, Any]:
    try:
        import pynvml
    except Exception as exc:
        return _error(exc)
    return query_nvml(pynvml)


def _main_rocm() -> dict[str, Any]:
    try:
        from pyrsmi import rocml
    except Exception as exc:
        return _error(exc)
    return query_rocml(rocml)


def _main_ascend() -> dict[str, Any]:
    exe = shutil.which("npu-smi")
    if exe is None:
        return {"ok": False, "error": "npu-smi not found on PATH"}
    try:
        proc = subprocess.run([exe, "info"], capture_output=True, text=True, timeout=SMI_TIMEOUT_S - 2)
    except Exception as exc:
        return _error(exc)
    if proc.returncode != 0:
        return {"ok": False, "error": f"npu-smi info exited {proc.returncode}: {proc.stderr.strip()[:200]}"}
    return parse_npu_smi(proc.stdout)


_MAINS = {"nvidia": _main_nvidia, "rocm": _main_rocm, "ascend": _main_ascend}


def run_smi(vendor: str, timeout: float = SMI_TIMEOUT_S) -> dict[str, Any]:
    """Query ``vendor``'s SMI in a child process; never raises, never hangs past ``timeout``."""
    if vendor not in _MAINS:
        return {"ok": False, "error": f"no SMI query for vendor {vendor!r}"}
    cmd = [sys.executable, "-m", "rlctl.platforms.smi", vendor]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"{vendor} SMI query timed out after {timeout:.0f}s"}
    except Exception as exc:
        return _error(exc)
    # vendor libraries may print to stdout before we do: take the last line that is JSON
    for line in reversed(proc.stdout.strip().splitlines()):
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if isinstance(data, dict) and "ok" in data:
            return data
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    return {"ok": False, "error": f"{vendor} SMI child exited {proc.returncode}: {tail[:200]}"}


if __name__ == "__main__":  # pragma: no cover - exercised through run_smi in a subprocess
    name = sys.argv[1] if len(sys.argv) > 1 else ""
    try:
        result = _MAINS[name]() if name in _MAINS else {"ok": False, "error": f"unknown vendor {name!r}"}
    except BaseException as exc:  # noqa: BLE001 - the parent must always get JSON
        result = _error(exc)
    sys.stdout.write(json.dumps(result) + "\n")
