"""One resolution of a run: profile + this host (or a target device spec) -> a ``RunPlan``.

The plan names the platform, the devices, the collective backend and, per role (actor, rollout,
ref, critic), the engine with the kernel setting the platform gives it (``EngineSettings``), its
environment, versions and pin verdicts; then per-device memory and every fit check. ``rlctl
train`` writes it to ``RUN_DIR/plan.json`` and builds its workers from it, ``rlctl doctor
--profile`` and ``rlctl plan`` show the same object.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rlctl.engines.engine_fields import resolve_engine_kwargs
from rlctl.errors import UserError
from rlctl.platforms.base import EngineSettings, Platform
from rlctl.platforms.catalogue import DeviceSpec, cpu_spec
from rlctl.platforms.pin_checks import evaluate_pins, pin_record
from rlctl.profile.schema import Profile
from rlctl.trainer.plan import choices
from rlctl.trainer.plan.fit import fit_checks
from rlctl.trainer.plan.shape import ModelShape
from rlctl.trainer.plan.target import describe_target, target_host
from rlctl.verdict import FAIL, PASS, Check

# distributions each engine runs on (the rollout engines' come from the platform)
TRAIN_DISTS = ("torch", "transformers")


@dataclass(frozen=True)
class RolePlan:
    """What one role runs: engine, kernel setting, environment, versions, pins."""

    role: str
    engine: str
    dtype: str
    settings: EngineSettings
    versions: dict[str, str | None] = field(default_factory=dict)
    pins: list[Check] = field(default_factory=list)  # judged pins (platforms.pin_checks)

    @property
    def kernel(self) -> str | None:
        return self.settings.kernel

    def to_dict(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "engine": self.engine,
            "dtype": self.dtype,
            "kernel": self.settings.kernel,
            "engine_kwargs": dict(self.settings.engine_kwargs),
            "env": dict(self.settings.env),
            "settings": self.settings.to_dict(),
            "versions": dict(self.versions),
            "pins": [pin_record(p) for p in self.pins],
        }


@dataclass
class RunPlan:
    """The whole run as it will be built (JSON-able through :meth:`to_dict`)."""

    profile: str
    target: str  # "this host" or "mi300x:8"
    platform: str
    platform_reason: str
    device: DeviceSpec
    nodes: int
    devices_per_node: int
    device_type: str
    dist_backend: str
    ray_resource: str
    dtype: str
    env: dict[str, str]
    roles: dict[str, RolePlan]
    model: ModelShape | None = None
    memory: dict[str, Any] = field(default_factory=dict)
    checks: list[Check] = field(default_factory=list)
    # the resolved Platform itself (not serialised): the run's env, pins and Ray resource come from it
    platform_object: Platform | None = field(default=None, repr=False, compare=False)

    @property
    def world(self) -> int:
        return self.nodes * self.devices_per_node

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if c.verdict == FAIL]

    def to_dict(self) -> dict[str, Any]:
        return {
            "profile": self.profile,
            "target": self.target,
            "platform": {"name": self.platform, "reason": self.platform_reason},
            "device": self.device.to_dict(),
            "nodes": self.nodes,
            "devices_per_node": self.devices_per_node,
            "world_size": self.world,
            "device_type": self.device_type,
            "dist_backend": self.dist_backend,
            "ray_resource": self.ray_resource,
            "dtype": self.dtype,
            "env": dict(self.env),
            "roles": {name: r.to_dict() for name, r in self.roles.items()},
            "model": self.model.to_dict() if self.model else None,
            "memory": self.memory,
            "checks": [{"name": c.name, "verdict": c.verdict.value, "detail": c.reason, "fix": c.fix} for c in self.checks],
            "verdict": (FAIL if self.failures else PASS).value,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, default=str) + "\n"

    def write(self, path: Path) -> None:
        path.write_text(self.to_json())


def _target_platform(device: DeviceSpec, count: int, engine: str | None = None) -> Platform:
    """The built-in platform that drives ``device``, answering as on a host of ``count`` of them
    with a supported install of its torch build and of ``engine`` (:mod:`.target`)."""
    import importlib

    from rlctl.platforms.resolve import BUILTINS

    module, _, name = BUILTINS[device.platform].partition(":")
    cls = getattr(importlib.import_module(module), name)
    return describe_target(cls(host=target_host(device, cls.torch_flavours[0], engine)), device, count)


def _rollout_engine_for_target(profile: Profile, platform: Platform) -> str:
    asked = profile.rollout.engine
    if asked != "auto":
        if asked not in platform.rollout_engines():
            raise UserError(
                f"{profile.source}: rollout.engine: {asked} does not run on the {platform.name} platform; "
                f"expected one of {', '.join(platform.rollout_engines())} (or auto)"
            )
        return asked
    return next((e for e in platform.engine_order if e != "hf"), "hf")


def _settings(profile: Profile, platform: Platform, engine: str, role: str) -> EngineSettings:
    """The platform's setting for ``engine``; an explicit ``platform.attention`` replaces the
    transformers engines' kernel, and the rollout role takes the profile's own engine keywords
    (``rollout.engine_kwargs``, where the schema has it) over the platform's."""
    settings = platform.engine_settings(engine)
    if role == "rollout":  # the profile's keywords over the platform's, checked against the engine
        kwargs = resolve_engine_kwargs(
            platform, engine, profile.rollout.engine_kwargs, where=f"{profile.source}: rollout.engine_kwargs"
        )
        settings = replace(settings, engine_kwargs=kwargs)
    asked = profile.platform.attention
    if asked != "auto" and engine in ("hf", "fsdp"):
        kwargs = {**settings.engine_kwargs, "attn_implementation": asked}
        return EngineSettings(
            engine,
            asked,
            kwargs,
            dict(settings.env),
            "profile platform.attention",
            f"{profile.source}: platform.attention",
        )
    return settings


def _versions(platform: Platform, dists: tuple[str, ...], known: bool) -> dict[str, str | None]:
    return {d: (platform.host.dists.version(d) if known else None) for d in dists}


def resolve_plan(
    profile: Profile,
    *,
    hardware: tuple[DeviceSpec, int] | None = None,
    platform: Platform | None = None,
) -> RunPlan:
    """The run ``profile`` describes, on this host (``hardware`` None) or on ``hardware`` =
    (device spec, devices per node). ``platform`` lets callers (tests) hand in a resolved one."""
    p = profile
    if hardware is None:
        platform = platform or choices.usable_platform(p)
        dtype = choices.compute_dtype(p, platform)
        rollout = choices.rollout_engine(p, platform)
        choices.check_engine_keys(p, rollout)
        choices.check_lora(p)
        device = cpu_spec(platform.host) if platform.device_type == "cpu" else _probed_device(platform)
        nodes, per_node, target = p.cluster.nodes, p.cluster.devices_per_node, "this host"
        reason = platform.resolution.reason if platform.resolution else "given by caller"
    else:
        device, per_node = hardware
        if platform is None:
            rollout = _rollout_engine_for_target(p, _target_platform(device, per_node))
            platform = _target_platform(device, per_node, rollout)
        else:
            rollout = _rollout_engine_for_target(p, platform)
        dtype = choices.compute_dtype(p, platform)  # from the target's compute capability, as on its host
        choices.check_engine_keys(p, rollout)
        choices.check_lora(p)
        nodes, target = p.cluster.nodes, f"{device.name}:{per_node}"
        reason = (
            f"target hardware {target} ({device.source}; {device.arch or 'arch n/a'}, "
            f"{device.interconnect or 'link n/a'}); kernels as on a host with the vendor's torch build "
            f"and the rollout engine's own requirements, no optional packages"
        )
    known = hardware is None
    verdicts = evaluate_pins(platform, rollout) if known else []
    rollout_dists = tuple(platform.engine_dists.get(rollout, (rollout,)))
    roles: dict[str, RolePlan] = {}

    def role(name: str, engine: str, role_dtype: str, dists: tuple[str, ...]) -> RolePlan:
        pins = [v for v in verdicts if v.details["package"] in (None, *dists)]
        return RolePlan(
            name,
            engine,
            role_dtype,
            _settings(p, platform, engine, name),
            _versions(platform, dists, known),
            pins,
        )

    roles["actor"] = role("actor", "fsdp", dtype, TRAIN_DISTS)
    roles["rollout"] = role("rollout", rollout, dtype, rollout_dists + ("torch",))
    if p.uses_reference and p.actor.lora is None:  # a LoRA actor is its own reference (adapter off)
        roles["ref"] = role("ref", "fsdp", dtype, TRAIN_DISTS)
    if p.uses_critic:
        roles["critic"] = role("critic", "fsdp", dtype, TRAIN_DISTS)
    plan = RunPlan(
        profile=p.source,
        target=target,
        platform=platform.name,
        platform_reason=reason,
        device=device,
        nodes=nodes,
        devices_per_node=per_node,
        device_type=platform.device_type,
        dist_backend=platform.dist_backend,
        ray_resource=platform.ray_resource,
        dtype=dtype,
        env=platform.rollout_env() if known else dict(platform.vendor_env()),
        roles=roles,
        platform_object=platform,
    )
    fit_checks(p, plan, verdicts)
    return plan


def _probed_device(platform: Platform) -> DeviceSpec:
    """This host's accelerator as the probe read it (memory from the SMI query where it has one),
    named by the closest catalogue entry when the probe gives a product name."""
    from rlctl.platforms.catalogue import CATALOGUE

    details = platform.probe().details
    devices = details.get("devices") or []
    name = str(devices[0].get("name", "")) if devices and isinstance(devices[0], dict) else ""
    total = devices[0].get("memory_total") if devices and isinstance(devices[0], dict) else None
    mem = round(int(total) / (1 << 30), 2) if isinstance(total, int) else None  # SMI: bytes
    for key, spec in CATALOGUE.items():
        if key in name.lower().replace(" ", ""):
            return spec if mem is None else DeviceSpec(**{**spec.to_dict(), "memory_gib": float(mem)})
    return DeviceSpec(
        name or platform.name, platform.name, float(mem or 0.0), None, None, None, "probe of this host"
    )


def refuse_failures(plan: RunPlan) -> None:
    """One UserError (exit 2) naming every FAIL check and its fix, before any worker starts."""
    failed = plan.failures
    if failed:
        parts = "; ".join(f"{c.name}: {c.reason} (fix: {c.fix})" for c in failed)
        raise UserError(f"{plan.profile}: the run plan has {len(failed)} FAIL check(s): {parts}")
