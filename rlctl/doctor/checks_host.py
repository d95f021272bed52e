"""Doctor checks about the host: chosen platform, machine, torch build, driver, kernels, env."""

from __future__ import annotations

import os
import platform as _py
import re
import subprocess
import sys
from dataclasses import replace

from rlctl.doctor.env_vars import relevant_env
from rlctl.platforms import Platform
from rlctl.verdict import Check, failed, passed, skipped, warned

MISSING_TOOL = ("ModuleNotFoundError", "not found on PATH")


def check_plugins(p: Platform) -> list[Check]:
    """Out-of-tree plugins that failed to load (they never stop resolution, but you should know)."""
    errors = getattr(p.resolution, "plugin_errors", {}) or {}
    return [
        warned(f"plugin:{name}", err, "fix or uninstall the plugin's package", "platform")
        for name, err in sorted(errors.items())
    ]


def check_near_misses(p: Platform) -> list[Check]:
    """Accelerators whose probe saw part of their stack but not a usable device (e.g. a container
    that sees the host's NVIDIA kernel module but got no /dev/nvidia*): a WARN each."""
    res = p.resolution
    rows = []
    for name, probe in res.probes.items() if res is not None else []:
        hint = probe.details.get("near_miss") if not probe.found else None
        if hint and name != p.name:
            fix = probe.details.get("near_miss_fix", f"see the {name} probe")
            rows.append(warned(f"probe:{name}", f"{name} not used: {hint}", fix, "platform"))
    return rows


def check_ray_devices(p: Platform) -> list[Check]:
    """Will Ray see this platform's devices? On ROCm, Ray 2.60 needs the amdsmi package."""
    check = getattr(p, "ray_gpu_check", None)
    if check is None or not p.probe().found:
        return []
    status, reason, fix = check()
    if status == "ok":
        return [passed("ray-devices", reason, "platform")]
    if status == "fail":
        return [failed("ray-devices", reason, fix, "platform")]
    return [skipped("ray-devices", reason, "platform")]


def check_ray_network(p: Platform) -> list[Check]:
    """Who can reach the Ray cluster rlctl starts: loopback only, and whether a token is required."""
    version = p.host.dists.version("ray")
    if version is None:
        return []
    try:  # rlctl.dispatch imports torch: a broken torch must not crash doctor (see torch-import)
        from rlctl.dispatch.ray_network import token_auth
    except Exception as exc:
        return [skipped("ray-network", f"not checked: {type(exc).__name__}: {exc}"[:300], "platform")]
    auth_on, auth = token_auth(version, dict(p.host.env))
    where = "local clusters rlctl starts listen on 127.0.0.1 only"
    if auth_on:
        return [passed("ray-network", f"{where}; {auth}", "platform")]
    return [warned("ray-network", f"{where}, but {auth}: any local user can run code in them",
                   "pip install 'ray>=2.59' and leave RAY_AUTH_MODE unset", "platform")]  # fmt: skip


def check_torch_import(p: Platform, timeout: float = 120.0) -> list[Check]:
    """``import torch`` in a child when a ``torch.backends`` plugin (torch_npu) is installed:
    torch imports every such plugin itself, so a broken torch_npu breaks ``import torch``."""
    plugins = p.host.dists.entry_points("torch.backends")
    if not plugins or p.host.torch.version is None:
        return []
    names = ", ".join(sorted({f"{dist} ({name})" for dist, name, _ in plugins}))
    if p.host.env.get("TORCH_DEVICE_BACKEND_AUTOLOAD") == "0":
        return [skipped("torch-import", f"TORCH_DEVICE_BACKEND_AUTOLOAD=0: {names} not autoloaded", "torch")]
    env = {**os.environ, **p.host.env, "PYTHONWARNINGS": "ignore"}
    if p.host.path is not None:
        env["PYTHONPATH"] = os.pathsep.join(p.host.path)
    try:
        proc = subprocess.run(
            [sys.executable, "-c", "import torch"], capture_output=True, text=True, timeout=timeout, env=env
        )
    except subprocess.TimeoutExpired:
        return [failed("torch-import", f"import torch timed out after {timeout:.0f}s (autoloads {names})",
                       "check the torch.backends plugins: " + names, "torch")]  # fmt: skip
    if proc.returncode == 0:
        return [passed("torch-import", f"import torch works and autoloads {names}", "torch")]
    lines = [ln.strip() for ln in proc.stderr.strip().splitlines() if ln.strip()]
    # a chained traceback: the plugin's own error first, torch's "Failed to load ..." last
    errors = [ln[:200] for ln in lines if re.match(r"^[\w.]+(Error|Exception|Exit)\b", ln)]
    why = " -> ".join(dict.fromkeys([errors[0], errors[-1]])) if errors else (lines or [""])[-1][:300]
    why = why or f"exit code {proc.returncode}"
    torch_v = p.host.torch.base_version or "your torch"
    fix = (
        f"reinstall the backend built for torch {torch_v} (e.g. pip install 'torch-npu=={torch_v}.*'), "
        "or set TORCH_DEVICE_BACKEND_AUTOLOAD=0 to import torch without it"
    )
    return [failed("torch-import", f"import torch fails because it autoloads {names}: {why}", fix, "torch")]


def check_busy_devices(p: Platform) -> list[Check]:
    """Processes the vendor SMI shows holding device memory (npu-smi's process table)."""
    procs = p.probe().details.get("processes") or []
    if not procs:
        return []
    where = "; ".join(p.process_line(q) for q in procs[:4])
    where += f" (+{len(procs) - 4} more)" if len(procs) > 4 else ""
    vis = p.visible_devices_env or "the visible-devices variable"
    return [
        warned(
            "devices-busy",
            f"{len(procs)} process(es) already hold device memory: {where}",
            f"stop them, or pick free devices with {vis}",
            "driver",
            processes=procs,
        )
    ]


def check_platform(p: Platform) -> Check:
    """The chosen platform, why, and whether its hardware is actually here."""
    res = p.resolution
    why = res.reason if res is not None else "chosen by the caller"
    probe = p.probe()
    details = {"tier": getattr(res, "tier", None), "probe": probe.reason, **p.describe()}
    if not probe.found:
        fix = p.driver_fix or "run on a host with this platform's devices, or unset RLCTL_PLATFORM"
        return failed("platform", f"{p.name} {why}, but {probe.reason}", fix, "platform", **details)
    return passed("platform", f"{p.name} {why}", "platform", **details)


def _meminfo_gib() -> float | None:
    try:
        with open("/proc/meminfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 1024**2, 1)
    except (OSError, ValueError, IndexError):
        return None
    return None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.lower().startswith(("model name", "hardware", "cpu model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return _py.processor() or _py.machine()


def check_host() -> Check:
    """OS, Python, CPU and memory (informational; old Python warns)."""
    mem = _meminfo_gib()
    info = {
        "os": _py.platform(),
        "python": _py.python_version(),
        "executable": sys.executable,
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "memory_gib": mem,
    }
    line = f"{info['os']}, Python {info['python']}, {info['cores']} x {info['cpu']}, {mem or '?'} GiB RAM"
    return passed("host", line, "host", **info)


def check_torch(p: Platform) -> Check:
    """torch's build flavour (read from torch/version.py, not imported) against the platform."""
    tb = p.host.torch
    details = {
        "version": tb.version,
        "flavour": tb.flavour,
        "cuda": tb.cuda,
        "hip": tb.hip,
        "source": tb.source,
    }
    fix = p.torch_install or "install the torch build this platform needs"
    if tb.version is None:
        return failed("torch", "torch is not installed", fix, "torch", **details)
    build = f"torch {tb.version} ({tb.flavour} build" + (f", CUDA {tb.cuda}" if tb.cuda else "")
    build += f", HIP {tb.hip})" if tb.hip else ")"
    if tb.flavour not in p.torch_flavours:
        want = " or ".join(p.torch_flavours)
        return failed("torch", f"{build}, but {p.name} needs a {want} build", fix, "torch", **details)
    vendor = p.torch_check(build)
    if vendor is not None:
        return replace(vendor, details={**details, **vendor.details})
    return passed("torch", f"{build} fits {p.name}", "torch", **details)


def check_driver(p: Platform) -> Check:
    """Driver and toolkit versions as the probe read them (a platform without a driver says so
    through :meth:`Platform.driver_check`)."""
    probe = p.probe()
    d = probe.details
    if not probe.found:
        return skipped("driver", f"no {p.name} device found (see platform)", "driver", **d)
    err = d.get("smi_error")
    if err and any(m in err for m in MISSING_TOOL):
        tool = p.smi_tool or "the vendor SMI tool"
        return warned(
            "driver", f"device files found; {tool} unavailable: {err}", f"install {tool}", "driver", **d
        )
    if err:
        fix = p.driver_fix or "fix the vendor driver"
        return failed("driver", f"{p.name} management library failed: {err}", fix, "driver", **d)
    parts = []
    for key, label in (("driver_version", "driver"), ("cuda_driver", "CUDA driver API"),
                       ("rocm_version", "ROCm"), ("cann_version", "CANN")):  # fmt: skip
        if d.get(key):
            parts.append(f"{label} {d[key]}")
    vendor = p.driver_check(d)
    if vendor is not None:
        return vendor
    devs = d.get("devices", [])
    return passed("driver", f"{len(devs)} device(s); " + ", ".join(parts), "driver", **d)


def check_kernels(p: Platform) -> list[Check]:
    """Each engine's kernel setting on this platform (training's attention implementation, and
    per rollout engine its kernel, keywords, environment and source), then the rollout engine."""
    att = p.attention_candidates()
    chosen = next((c for c in att if c.chosen), None)
    rows = [
        passed(
            "attention",
            f"{p.attention_impl()}: {chosen.reason if chosen else 'fallback'} (training and HF rollout)",
            "kernels",
            candidates=[vars(c) for c in att],
        )
    ]
    for name in p.rollout_engines():
        if name == "hf":
            continue
        s = p.engine_settings(name)
        kernel = s.kernel or "the engine's own choice"
        keywords = f"; keywords {s.engine_kwargs}" if s.engine_kwargs else ""
        rows.append(passed(f"engine:{name}", f"{kernel}: {s.reason}{keywords}", "kernels", **s.to_dict()))
    eng = p.rollout_engine_candidates()
    engine, reason = p.auto_rollout_engine()
    candidates = [vars(c) for c in eng]
    first = p.rollout_engines()[0]
    if engine is not None:
        rows.append(passed("rollout-engine", f"{engine}: {reason}", "kernels", candidates=candidates))
    elif "hf" in p.installed_rollout_engines():
        rows.append(
            warned(
                "rollout-engine",
                f"rollout.engine = auto will refuse to start: {reason}",
                f'{p.engine_install_hint(first)} for fast rollout, or set rollout.engine = "hf"',
                "kernels",
                candidates=candidates,
            )
        )
    else:
        rows.append(
            failed(
                "rollout-engine",
                f"no rollout engine installed: {reason}",
                p.engine_install_hint(first)
                + ("" if first == "hf" else f'; or, for rollout.engine = "hf": {p.engine_install_hint("hf")}'),
                "kernels",
                candidates=candidates,
            )
        )
    return rows


def check_env(p: Platform) -> list[Check]:
    """Variables that matter (secrets redacted) and the ones that are wrong for this platform."""
    env = relevant_env(p.host.env)
    rows = [
        passed(
            "env", f"{len(env)} relevant variable(s) set: {', '.join(env) or 'none'}", "env", variables=env
        )
    ]
    src = p.env_sources()
    if src["rlctl_sets"] or src["user_set"]:
        parts = [f"rlctl sets {k}={v}" for k, v in src["rlctl_sets"].items()]
        parts += [f"keeps your {k}={v}" for k, v in src["user_set"].items()]
        rows.append(passed("env:vendor", "; ".join(parts) + " (for the worker processes)", "env", **src))
    vis = p.visible_devices_env
    if vis and p.host.env.get(vis, None) == "":
        rows.append(
            warned("env:" + vis, f"{vis} is set but empty: no device is visible", f"unset {vis}", "env")
        )
    return rows
