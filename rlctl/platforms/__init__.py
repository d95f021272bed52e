"""Hardware platforms: what to run with on this host (backend, Ray resource, env, kernels, pins).

Importing this package never imports torch, Ray or a vendor library; probes read files, package
metadata and vendor SMI answers from child processes. Entry point: ``resolve_platform``.
"""

from rlctl.platforms.base import Candidate, EngineSettings, Platform, ProbeResult, Resolution
from rlctl.platforms.host import Host
from rlctl.platforms.pin_checks import evaluate_pin, evaluate_pins, pin_record
from rlctl.platforms.pins import Facts, Pin, load_pins
from rlctl.platforms.resolve import (
    BUILTINS,
    ENTRY_POINT_GROUP,
    known_platforms,
    resolve_platform,
)
from rlctl.platforms.runtime_spec import RuntimeSpec

__all__ = [
    "BUILTINS",
    "ENTRY_POINT_GROUP",
    "Candidate",
    "EngineSettings",
    "Facts",
    "Host",
    "Pin",
    "Platform",
    "ProbeResult",
    "Resolution",
    "RuntimeSpec",
    "evaluate_pin",
    "evaluate_pins",
    "known_platforms",
    "load_pins",
    "pin_record",
    "resolve_platform",
]
