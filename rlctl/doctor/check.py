"""A doctor check result: a verdict (PASS / WARN / FAIL / SKIP), one line of reason, one fix."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class Verdict(str, enum.Enum):
    PASS = "PASS"
    WARN = "WARN"
    FAIL = "FAIL"
    SKIP = "SKIP"


@dataclass(frozen=True)
class CheckResult:
    """One row of the doctor report. ``fix`` is empty when nothing needs doing."""

    name: str
    verdict: Verdict
    reason: str
    fix: str = ""
    category: str = "general"
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "category": self.category,
            "verdict": self.verdict.value,
            "reason": self.reason,
            "fix": self.fix,
            "details": self.details,
        }


def passed(name: str, reason: str, category: str, /, **details: Any) -> CheckResult:
    return CheckResult(name, Verdict.PASS, reason, "", category, details)


def failed(name: str, reason: str, fix: str, category: str, /, **details: Any) -> CheckResult:
    return CheckResult(name, Verdict.FAIL, reason, fix, category, details)


def warned(name: str, reason: str, fix: str, category: str, /, **details: Any) -> CheckResult:
    return CheckResult(name, Verdict.WARN, reason, fix, category, details)


def skipped(name: str, reason: str, category: str, /, **details: Any) -> CheckResult:
    return CheckResult(name, Verdict.SKIP, reason, "", category, details)
