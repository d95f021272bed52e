"""The version pins a run is held to, evaluated once for the plan (trainer preflight).

One small function so the plan and ``rlctl doctor`` share the verdicts: it evaluates every pin of
``platforms/pins.toml`` that applies to the platform against the host's facts, as doctor's pin rows
do (``platforms.pin_checks.evaluate_pin``).
"""

from __future__ import annotations

from dataclasses import dataclass

from rlctl.platforms.base import Platform
from rlctl.platforms.pin_checks import evaluate_pin


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


def pin_verdicts(platform: Platform) -> list[PinVerdict]:
    """Every pin that applies to ``platform``, evaluated against its host."""
    facts = platform.facts()
    out = []
    for pin in platform.pins:
        outcome = evaluate_pin(pin, facts)
        out.append(
            PinVerdict(pin.id, pin.package, outcome.status, pin.severity, outcome.reason, pin.fix, pin.source)
        )
    return out
