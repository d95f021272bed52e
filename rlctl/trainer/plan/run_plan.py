"""One resolution of a run: profile + a host description (this host, or a ``--hardware`` target
described as a real host, :mod:`.host`) -> a ``RunPlan``, through one code path.

The plan names the platform, the devices, the collective backend and, per role (actor, rollout,
ref, critic), the engine with the kernel setting the platform gives it (``EngineSettings``), its
environment, versions and pin verdicts; then per-device memory and every fit check. ``rlctl
train`` writes it to ``RUN_DIR/plan.json`` and builds its workers from it, ``rlctl doctor
--profile`` and ``rlctl plan`` show the same object.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from rlctl.engines.engine_fields import resolve_engine_kwargs
from rlctl.errors import UserError
from rlctl.platforms.base import EngineSettings, Platform
from rlctl.platforms.catalogue import DeviceSpec
from rlctl.platforms.pin_checks import evaluate_pins, pin_record
from rlctl.profile.schema import Profile
from rlctl.trainer.plan import choices
from rlctl.trainer.plan.fit import fit_checks
from rlctl.trainer.plan.host import HostDescription, described_host, this_host
from rlctl.trainer.plan.shape import ModelShape
from rlctl.trainer.plan.specs import build_specs, moved_model
from rlctl.verdict import FAIL, PASS, Check

# distributions each engine runs on (the rollout engines' come from the platform)
TRAIN_DISTS = ("torch", "transformers")


@dataclass(frozen=True)
class RolePlan:
    """What one role runs: engine, kernel setting, environment, the spec its workers are built
    from; and what the host says of it (installed versions, pin verdicts)."""

    role: str
    engine: str
    dtype: str
    settings: EngineSettings
    versions: dict[str, str | None] = field(default_factory=dict)
    pins: list[Check] = field(default_factory=list)  # judged pins (platforms.pin_checks)
    spec: Any = None  # the role's spec (plan.specs): exactly what its workers receive

    @property
    def kernel(self) -> str | None:
        return self.settings.kernel

    def to_dict(self) -> dict[str, Any]:
        """The resolved part (the host's versions and pins are :meth:`RunPlan.to_dict`'s ``host``)."""
        return {
            "role": self.role,
            "engine": self.engine,
            "dtype": self.dtype,
            "kernel": self.settings.kernel,
            "engine_kwargs": dict(self.settings.engine_kwargs),
            "env": dict(self.settings.env),
            "settings": self.settings.to_dict(),
            "spec": asdict(self.spec) if self.spec is not None else None,
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

    @property
    def checkpointed_roles(self) -> list[str]:
        """The roles whose state a checkpoint of this run holds (the driver state lists them)."""
        return ["policy"] + (["critic"] if "critic" in self.roles else [])

    @property
    def policy(self) -> RolePlan:
        """The policy's training side (its rollout engine is ``roles["rollout"]``)."""
        return self.roles["policy"]

    def to_dict(self) -> dict[str, Any]:
        """``host``: what the host description says (which host, why this platform, installed
        versions, pin verdicts); every other key is resolved from the profile and the host's
        kind, so a run's ``plan.json`` and ``rlctl plan --hardware`` for the same kind of host
        agree on them byte for byte (:meth:`resolved_dict`)."""
        return {
            "host": {
                "target": self.target,
                "platform_reason": self.platform_reason,
                "versions": {name: dict(r.versions) for name, r in self.roles.items()},
                "pins": {name: [pin_record(p) for p in r.pins] for name, r in self.roles.items()},
            },
            **self.resolved_dict(),
        }

    def resolved_dict(self) -> dict[str, Any]:
        """Everything :meth:`to_dict` holds but the ``host`` section."""
        return {
            "profile": self.profile,
            "platform": {"name": self.platform},
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

    def with_model_path(self, old: str, new: str) -> RunPlan:
        """This plan with every spec loading ``old`` loading ``new`` instead (a built-in model
        made into the run's own directory after planning); nothing else changes."""
        roles = {name: replace(r, spec=moved_model(r.spec, old, new)) for name, r in self.roles.items()}
        return replace(self, roles=roles)

    def write(self, path: Path) -> None:
        path.write_text(self.to_json())


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


def resolve_plan(
    profile: Profile,
    *,
    hardware: tuple[DeviceSpec, int] | None = None,
    platform: Platform | None = None,
) -> RunPlan:
    """The run ``profile`` describes, on this host (``hardware`` None) or on ``hardware`` =
    (device spec, devices per node). ``platform`` lets callers (tests) hand in a resolved one."""
    host = this_host(profile, platform) if hardware is None else described_host(*hardware, platform)
    return resolve_on(profile, host)


def resolve_on(profile: Profile, host: HostDescription) -> RunPlan:
    """The one resolution: ``profile`` against ``host`` (this host's probe or a described target),
    every choice made by the same helpers whichever it is."""
    p, platform = profile, host.platform
    dtype = choices.compute_dtype(p, platform)
    rollout = choices.rollout_engine(p, platform)
    choices.check_engine_keys(p, rollout)
    choices.check_lora(p)
    verdicts = evaluate_pins(platform, rollout) if host.versions_known else []  # a target's are unknown
    rollout_dists = tuple(platform.engine_dists.get(rollout, (rollout,)))
    settings = {
        "policy": _settings(p, platform, "fsdp", "policy"),
        "rollout": _settings(p, platform, rollout, "rollout"),
    }
    specs = build_specs(
        p,
        device_type=platform.device_type,
        dtype=dtype,
        attn=settings["policy"].kernel or "sdpa",
        dist_backend=platform.dist_backend,
        rollout_engine=rollout,
        vendor=platform.name,
        rollout_engine_kwargs=settings["rollout"].engine_kwargs,
    )
    roles: dict[str, RolePlan] = {}

    def role(name: str, engine: str, dists: tuple[str, ...], spec: Any) -> RolePlan:
        pins = [v for v in verdicts if v.details["package"] in (None, *dists)]
        versions = {d: host.version(d) for d in dists}
        setting = settings.get(name) or _settings(p, platform, engine, name)
        return RolePlan(name, engine, dtype, setting, versions, pins, spec)

    roles["policy"] = role("policy", "fsdp", TRAIN_DISTS, specs.policy)
    roles["rollout"] = role("rollout", rollout, rollout_dists + ("torch",), specs.policy.rollout)
    if specs.ref is not None:  # a LoRA actor is its own reference (adapter off): no ref role
        roles["ref"] = role("ref", "fsdp", TRAIN_DISTS, specs.ref)
    if specs.critic is not None:
        roles["critic"] = role("critic", "fsdp", TRAIN_DISTS, specs.critic)
    plan = RunPlan(
        profile=p.source,
        target=host.label,
        platform=platform.name,
        platform_reason=host.reason,
        device=host.device,
        nodes=p.cluster.nodes,
        devices_per_node=host.devices_per_node,
        device_type=platform.device_type,
        dist_backend=platform.dist_backend,
        ray_resource=platform.ray_resource,
        dtype=dtype,
        env=platform.rollout_env(),  # a target has no user environment: rlctl's defaults
        roles=roles,
        platform_object=platform,
    )
    fit_checks(p, plan, verdicts)
    return plan


def refuse_failures(plan: RunPlan) -> None:
    """One UserError (exit 2) naming every FAIL check and its fix, before any worker starts."""
    failed = plan.failures
    if failed:
        parts = "; ".join(f"{c.name}: {c.reason} (fix: {c.fix})" for c in failed)
        raise UserError(f"{plan.profile}: the run plan has {len(failed)} FAIL check(s): {parts}")
