"""``Check``: the one verdict type of doctor's rows, the plan's checks and the pins.

A check has a name, a verdict (PASS / WARN / FAIL / SKIP), one line of reason and one fix, a
category (doctor's grouping) and details (what was read on the way; a pin's id, status, severity,
source and symptom). ``rlctl doctor``, ``rlctl plan``, the trainer's preflight and the pin
evaluator all build and read this one type.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class Verdict(str, enum.Enum):
    PASS = "PASS"
    WARN = "WARN"
    FAIL = "FAIL"
    SKIP = "SKIP"

    def __str__(self) -> str:
        return self.value


PASS, WARN, FAIL, SKIP = Verdict.PASS, Verdict.WARN, Verdict.FAIL, Verdict.SKIP


@dataclass(frozen=True)
class Check:
    """One verdict. ``fix`` is empty when nothing needs doing."""

    name: str
    verdict: Verdict
    reason: str
    fix: str = ""
    category: str = "general"
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def blocks(self) -> bool:
        """A FAIL stops a run (a fail-severity pin violated, a plan check that does not fit)."""
        return self.verdict == FAIL

    def line(self) -> str:
        """The plan's one-line form: ``VERDICT name: reason -> fix: ...``."""
        fix = f" -> fix: {self.fix}" if self.verdict != PASS and self.fix else ""
        return f"{self.verdict} {self.name}: {self.reason}{fix}"

    def to_dict(self) -> dict[str, Any]:
        """Doctor's JSON row."""
        return {
            "name": self.name,
            "category": self.category,
            "verdict": self.verdict.value,
            "reason": self.reason,
            "fix": self.fix,
            "details": self.details,
        }


def passed(name: str, reason: str, category: str, /, **details: Any) -> Check:
    return Check(name, PASS, reason, "", category, details)


def failed(name: str, reason: str, fix: str, category: str, /, **details: Any) -> Check:
    return Check(name, FAIL, reason, fix, category, details)


def warned(name: str, reason: str, fix: str, category: str, /, **details: Any) -> Check:
    return Check(name, WARN, reason, fix, category, details)


def skipped(name: str, reason: str, category: str, /, **details: Any) -> Check:
    return Check(name, SKIP, reason, "", category, details)
