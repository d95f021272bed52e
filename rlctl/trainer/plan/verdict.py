"""One line of a plan's checks: PASS, WARN (a pin that does not block) or FAIL, with the fix."""

from __future__ import annotations

from dataclasses import dataclass

PASS, WARN, FAIL = "PASS", "WARN", "FAIL"


@dataclass(frozen=True)
class Check:
    """One divisibility or fit check: the verdict, what was compared, and the fix."""

    name: str
    verdict: str
    detail: str
    fix: str = ""

    def line(self) -> str:
        fix = f" -> fix: {self.fix}" if self.verdict != PASS and self.fix else ""
        return f"{self.verdict} {self.name}: {self.detail}{fix}"
