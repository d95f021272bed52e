"""Hardware platforms: what to run with on this host (backend, Ray resource, env, kernels, pins).

Importing this package never imports torch, Ray or a vendor library; probes read files, package
metadata and vendor SMI answers from child processes. Entry point: ``resolve_platform``.
"""

from rlctl.platforms.base import Candidate, EngineSettings, Platform, ProbeResult, Resolution
from rlctl.platforms.host import Host
from rlctl.platforms.pin_checks import PinVerdict, evaluate_pin, evaluate_pins
from rlctl.platforms.pins import Facts, Pin, PinOutcome, load_pins
from rlctl.platforms.resolve import (
    BUILTINS,
    ENTRY_POINT_GROUP,
    known_platforms,
    resolve_platform,
)

__all__ = [
    "BUILTINS",
    "ENTRY_POINT_GROUP",
    "Candidate",
    "EngineSettings",
    "Facts",
    "Host",
    "Pin",
    "PinOutcome",
    "PinVerdict",
    "Platform",
    "ProbeResult",
    "Resolution",
    "evaluate_pin",
    "evaluate_pins",
    "known_platforms",
    "load_pins",
    "resolve_platform",
]
