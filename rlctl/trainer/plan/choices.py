"""The profile's ``auto`` choices made concrete against the resolved platform, checked on the driver.

Each function either returns what the run will use or raises one UserError naming the profile key,
so a wrong dtype or a missing rollout engine stops the run before any worker starts.
"""

from __future__ import annotations

from rlctl.errors import UserError
from rlctl.platforms import resolve_platform
from rlctl.platforms.base import Platform
from rlctl.profile.schema import Profile, RolloutSection


def usable_platform(profile: Profile) -> Platform:
    """The profile's platform (``platform.vendor``), refused when its hardware is not on this host."""
    platform = resolve_platform(profile.platform.vendor)
    probe = platform.probe()
    if not probe.found:
        raise UserError(
            f"{profile.source}: platform.vendor: {platform.name} is not usable here: {probe.reason}"
        )
    return platform


def single_process_engines(profile: Profile) -> tuple[str, str]:
    """``(device, compute dtype)`` for the one-process commands (sft, eval) on the profile's platform."""
    platform = usable_platform(profile)
    return platform.device_type, compute_dtype(profile, platform)


def compute_dtype(profile: Profile, platform: Platform) -> str:
    """``platform.dtype``: ``auto`` is the platform's default; an explicit dtype must be supported."""
    asked = profile.platform.dtype
    if asked == "auto":
        return platform.default_dtype()
    supported = platform.supported_dtypes()
    if asked not in supported:
        raise UserError(
            f"{profile.source}: platform.dtype: {asked} is not supported by this {platform.name} host's "
            f"devices; expected one of {', '.join(supported)} (or auto)"
        )
    return asked


def rollout_engine(profile: Profile, platform: Platform) -> str:
    """``rollout.engine``: ``auto`` takes the platform's choice; an explicit engine must run here."""
    asked = profile.rollout.engine
    if asked == "auto":
        engine, reason = platform.auto_rollout_engine()
        if engine is None:
            raise UserError(f"{profile.source}: rollout.engine: auto: {reason}")
        return engine
    if asked not in platform.rollout_engines():
        raise UserError(
            f"{profile.source}: rollout.engine: {asked} does not run on the {platform.name} platform; "
            f"expected one of {', '.join(platform.rollout_engines())} (or auto)"
        )
    if asked not in platform.installed_rollout_engines():
        needs = ", ".join(platform.engine_dists.get(asked, (asked,)))
        raise UserError(
            f"{profile.source}: rollout.engine: {asked} is not installed (needs {needs}); "
            f"{platform.engine_install_hint(asked)}, or choose another engine"
        )
    return asked


def check_engine_keys(profile: Profile, engine: str) -> None:
    """Keys only some engines read: refuse them where the chosen engine would ignore them."""
    r = profile.rollout
    default_memory = RolloutSection.__dataclass_fields__["gpu_memory_utilization"].default
    if engine == "hf" and r.gpu_memory_utilization != default_memory:
        raise UserError(
            f"{profile.source}: rollout.gpu_memory_utilization: set to {r.gpu_memory_utilization}, but the "
            "HF rollout engine allocates as it goes and reads no memory fraction (only vllm/sglang do)"
        )


def check_lora(profile: Profile) -> None:
    """``[actor.lora]`` needs peft, and its reference is the base it adapts (no other ``ref.path``)."""
    import importlib.util

    if profile.actor.lora is None:
        return
    if profile.uses_reference and profile.ref.path and profile.ref.path != profile.model.path:
        raise UserError(
            f"{profile.source}: ref.path: {profile.ref.path!r}, but with [actor.lora] the reference "
            "policy is the actor's own base (adapter off); remove ref.path or the [actor.lora] table"
        )
    if importlib.util.find_spec("peft") is None:
        raise UserError(
            f"{profile.source}: actor.lora: LoRA training needs the peft package; pip install 'rlctl[lora]'"
        )
