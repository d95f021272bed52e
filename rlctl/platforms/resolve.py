"""Choosing the platform: explicit vendor, then ``RLCTL_PLATFORM``, then one out-of-tree plugin,
then the one built-in accelerator whose probe matches, CPU last.

Every probe's answer is kept in a ``Resolution`` so ``rlctl doctor`` can say why a platform was
chosen and why the others were not. Two matches at the same tier is a ``UserError``.
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
import os
from collections.abc import Iterable, Mapping
from typing import Any

from rlctl.errors import UserError
from rlctl.platforms.base import Platform, ProbeResult, Resolution
from rlctl.platforms.bounded import call_bounded, probe_timeout
from rlctl.platforms.host import Host

ENTRY_POINT_GROUP = "rlctl.platforms"
ENV_VAR = "RLCTL_PLATFORM"

# Built-in vendors by qualified name (as vLLM's ``vllm/platforms/__init__.py`` does): this module
# imports no vendor, so a vendor module may import anything below it without an import circle.
BUILTINS: dict[str, str] = {
    "nvidia": "rlctl.platforms.nvidia:NvidiaPlatform",
    "rocm": "rlctl.platforms.rocm:RocmPlatform",
    "ascend": "rlctl.platforms.ascend:AscendPlatform",
    "cpu": "rlctl.platforms.cpu:CpuPlatform",
}
ALIASES = {"cuda": "nvidia", "amd": "rocm", "hip": "rocm", "npu": "ascend"}


def builtin_type(name: str) -> type[Platform]:
    """The class of the built-in platform ``name`` (a key of :data:`BUILTINS`)."""
    module, _, cls = BUILTINS[name].partition(":")
    return getattr(importlib.import_module(module), cls)


def builtin_platform(name: str, host: Host) -> Platform:
    """The built-in platform ``name`` (a key of :data:`BUILTINS`) for ``host``."""
    return builtin_type(name)(host=host)


def _plugin_entry_points(eps: Iterable[Any] | None) -> list[Any]:
    if eps is not None:
        return list(eps)
    try:
        return list(md.entry_points(group=ENTRY_POINT_GROUP))
    except Exception:  # broken metadata somewhere on sys.path must not stop rlctl
        return []


def _load_plugins(eps: list[Any], host: Host) -> tuple[dict[str, Platform], dict[str, str]]:
    """Instantiate each out-of-tree plugin; failures are kept as reasons, never raised."""
    plugins: dict[str, Platform] = {}
    errors: dict[str, str] = {}
    limit = probe_timeout(host.env)
    for ep in eps:
        try:
            # importing a plugin runs its code: bounded in time and isolated from sys.exit
            plat = call_bounded(lambda ep=ep: ep.load()(host=host), limit, f"plugin {ep.name} load")
            if not isinstance(plat, Platform):
                raise TypeError(f"{ep.value} returned {type(plat).__name__}, not a rlctl Platform")
            plugins[ep.name] = plat
        except Exception as exc:
            errors[ep.name] = (
                f"plugin {ep.name} ({getattr(ep, 'value', '?')}) failed to load: {type(exc).__name__}: {exc}"
            )
    return plugins, errors


def known_platforms(entry_points: Iterable[Any] | None = None) -> list[str]:
    """Built-in names plus the names of registered out-of-tree plugins."""
    return sorted(set(BUILTINS) | {ep.name for ep in _plugin_entry_points(entry_points)})


def _select(name: str, source: str, host: Host, eps: list[Any], tier: str) -> Platform:
    key = ALIASES.get(name.lower(), name.lower())
    if key in BUILTINS:
        plat: Platform = builtin_platform(key, host)
        errors: dict[str, str] = {}
    else:
        plugins, errors = _load_plugins([ep for ep in eps if ep.name == key], host)
        if key not in plugins:
            if key in errors:
                raise UserError(f"{source}: {errors[key]}")
            known = ", ".join(sorted(set(BUILTINS) | {ep.name for ep in eps}))
            raise UserError(f"{source}: unknown platform {name!r}; expected one of: auto, {known}")
        plat = plugins[key]
    plat.resolution = Resolution(key, tier, f"chosen because {source} = {name!r}", plugin_errors=errors)
    return plat


def resolve_platform(
    vendor: str = "auto",
    env: Mapping[str, str] | None = None,
    *,
    host: Host | None = None,
    entry_points: Iterable[Any] | None = None,
) -> Platform:
    """The platform to run on; ``platform.resolution`` says why. Raises UserError on ambiguity.

    ``vendor`` is the profile's ``platform.vendor``; ``env`` defaults to ``os.environ``;
    ``host`` and ``entry_points`` let tests inject a fake machine and fake plugins.
    """
    env = dict(os.environ) if env is None else dict(env)
    host = host if host is not None else Host(env=env)
    eps = _plugin_entry_points(entry_points)
    if vendor and vendor.lower() != "auto":
        return _select(vendor, "platform.vendor", host, eps, "explicit")
    from_env = env.get(ENV_VAR, "").strip()
    if from_env and from_env.lower() != "auto":
        return _select(from_env, ENV_VAR, host, eps, "env")

    probes: dict[str, ProbeResult] = {}
    plugins, errors = _load_plugins(eps, host)
    for name, plat in plugins.items():
        probes[f"plugin:{name}"] = plat.probe()
    matched = [n for n, p in plugins.items() if p.probe().found]
    if len(matched) > 1:
        lines = "; ".join(f"{n}: {plugins[n].probe().reason}" for n in matched)
        raise UserError(
            f"{len(matched)} out-of-tree platform plugins match this host ({lines}); "
            f"choose one with {ENV_VAR} or platform.vendor"
        )
    if matched:
        plat = plugins[matched[0]]
        plat.resolution = Resolution(
            matched[0],
            "plugin",
            f"chosen because out-of-tree plugin matched: {plat.probe().reason}",
            probes,
            errors,
        )
        return plat

    accel = {n: builtin_platform(n, host) for n in BUILTINS if n != "cpu"}
    for n, p in accel.items():
        probes[n] = p.probe()
    found = [n for n, p in accel.items() if p.probe().found]
    if len(found) > 1:
        lines = "; ".join(f"{n}: {accel[n].probe().reason}" for n in found)
        raise UserError(
            f"{len(found)} built-in platforms match this host ({lines}); "
            f"choose one with {ENV_VAR} or platform.vendor"
        )
    if found:
        plat = accel[found[0]]
        plat.resolution = Resolution(
            found[0], "builtin", f"chosen because {plat.probe().reason}", probes, errors
        )
        return plat
    cpu = builtin_platform("cpu", host)
    probes["cpu"] = cpu.probe()
    cpu.resolution = Resolution(
        "cpu", "fallback", "chosen because no accelerator probe matched (CPU comes last)", probes, errors
    )
    return cpu
