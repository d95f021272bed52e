"""The host a run is resolved against: this host as its probe reads it, or a ``--hardware`` target
described as completely as a real host (:mod:`.target`).

Resolution (:func:`rlctl.trainer.plan.run_plan.resolve_plan`) reads only a ``HostDescription``, so a
run and ``rlctl plan --hardware`` for the same kind of host pick dtype, engine, kernels and
environment through one code path. What the description cannot know of a target (installed
versions, the user's environment) is recorded as unknown, not guessed.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlctl.platforms.base import Platform
from rlctl.platforms.catalogue import DeviceSpec, cpu_spec
from rlctl.profile.schema import Profile
from rlctl.trainer.plan import choices
from rlctl.trainer.plan.target import describe_target, target_host


@dataclass(frozen=True)
class HostDescription:
    """One node of the cluster a run is resolved for: its platform (answering for that node), the
    device, how many per node, a label, why this platform, and whether installed versions are known."""

    platform: Platform
    device: DeviceSpec
    devices_per_node: int
    label: str  # "this host" or "h100:8"
    reason: str
    versions_known: bool  # False for a described target: every version reads as unknown

    def version(self, dist: str) -> str | None:
        """The installed version of ``dist`` (None where the description does not know it)."""
        return self.platform.host.dists.version(dist) if self.versions_known else None


def this_host(profile: Profile, platform: Platform | None = None) -> HostDescription:
    """This host: the profile's platform (refused when its hardware is not here), its probed device
    and the profile's ``cluster.devices_per_node``. ``platform`` lets callers hand in a resolved one."""
    platform = platform or choices.usable_platform(profile)
    device = cpu_spec(platform.host) if platform.device_type == "cpu" else probed_device(platform)
    reason = platform.resolution.reason if platform.resolution else "given by caller"
    return HostDescription(platform, device, profile.cluster.devices_per_node, "this host", reason, True)


def described_host(device: DeviceSpec, count: int, platform: Platform | None = None) -> HostDescription:
    """A host of ``count`` x ``device``: the built-in platform that drives it, its probe reading the
    catalogue's device, with a supported install of the vendor's torch build and of every rollout
    engine that platform runs (versions unknown). ``platform`` lets tests hand in their own."""
    label = f"{device.name}:{count}"
    reason = (
        f"target hardware {label} ({device.source}; {device.arch or 'arch n/a'}, "
        f"{device.interconnect or 'link n/a'}); kernels as on a host with the vendor's torch build "
        f"and the rollout engines' own requirements, no optional packages"
    )
    platform = platform or target_platform(device, count)
    return HostDescription(platform, device, count, label, reason, False)


def target_platform(device: DeviceSpec, count: int) -> Platform:
    """The built-in platform that drives ``device``, answering as on a host of ``count`` of them."""
    import importlib

    from rlctl.platforms.resolve import BUILTINS

    module, _, name = BUILTINS[device.platform].partition(":")
    cls = getattr(importlib.import_module(module), name)
    return describe_target(cls(host=target_host(device, cls.torch_flavours[0])), device, count)


def probed_device(platform: Platform) -> DeviceSpec:
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
