"""The version pins a run is held to, evaluated once for the plan (trainer preflight).

The plan and ``rlctl doctor`` share the verdicts (``platforms.pin_checks.evaluate_pins``); the plan
adds each pin's package so a role carries the pins of what it runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlctl.platforms.base import Platform
from rlctl.platforms.pin_checks import evaluate_pins
from rlctl.platforms.pins import load_pins


@dataclass(frozen=True)
class PinVerdict:
    """``status``: ok | violated | n/a | unknown; ``blocks`` when a violated pin is fail-severity."""

    id: str
    package: str | None
    status: str
    severity: str
    reason: str
    fix: str
    source: str

    @property
    def blocks(self) -> bool:
        return self.status == "violated" and self.severity == "fail"


def pin_verdicts(platform: Platform, engine: str | None = None) -> list[PinVerdict]:
    """Every pin that applies to ``platform``, judged for a run whose rollout engine is ``engine``
    (``platforms.pin_checks.evaluate_pins``, the same verdicts doctor's pin rows show)."""
    package = {pin.id: pin.package for pin in load_pins()}
    return [
        PinVerdict(v.id, package.get(v.id), v.status, v.severity, v.reason, v.fix, v.source)
        for v in evaluate_pins(platform, engine)
    ]
