"""Runs every doctor check for a platform and renders the report (rich table or JSON)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from rlctl.doctor import checks_host, checks_lora, checks_packages, checks_sandbox, deep
from rlctl.platforms import Platform
from rlctl.trainer.plan.run_plan import RunPlan
from rlctl.verdict import PASS, Check, Verdict, failed, skipped

DEEP_TIMEOUT_S = 120.0


@dataclass
class Report:
    """The platform, its resolution and every check result; ``exit_code`` is 1 if any FAILed."""

    platform: Platform
    checks: list[Check] = field(default_factory=list)
    plan: RunPlan | None = None  # with --profile: the run's plan, exactly as `rlctl train` builds it
    plan_error: str | None = None  # with --profile: why no plan resolved on this host

    @property
    def exit_code(self) -> int:
        return 1 if any(c.verdict is Verdict.FAIL for c in self.checks) else 0

    def counts(self) -> dict[str, int]:
        return {v.value: sum(c.verdict is v for c in self.checks) for v in Verdict}

    def to_dict(self) -> dict[str, Any]:
        res = self.platform.resolution
        return {
            "platform": {
                **self.platform.describe(),
                "resolution": res.to_dict() if res is not None else None,
                "probe": {
                    "found": self.platform.probe().found,
                    "reason": self.platform.probe().reason,
                    "details": self.platform.probe().details,
                },
            },
            "checks": [c.to_dict() for c in self.checks],
            "plan": self.plan.to_dict() if self.plan is not None else None,
            "summary": self.counts(),
            "exit_code": self.exit_code,
        }


def plan_rows(plan: RunPlan | None, error: str | None) -> list[Check]:
    """The run plan's checks as doctor rows (category ``plan``); a plan that did not resolve
    on this host is one FAIL row with its reason."""
    if error is not None:
        return [failed("plan", error, "fix the profile or run on the hardware it names", "plan")]
    checks = plan.checks if plan is not None else []
    return [replace(c, name=f"plan:{c.name}", category="plan", fix="" if c.verdict is PASS else c.fix) for c in checks]


def run_doctor(
    platform: Platform,
    deep_checks: bool = False,
    timeout: float = DEEP_TIMEOUT_S,
    plan: RunPlan | None = None,
    plan_error: str | None = None,
) -> Report:
    """All checks, in report order; ``deep_checks`` adds imports, device count and a collective.
    With a profile's ``plan`` (``rlctl doctor --profile``) its checks come last."""
    p = platform
    rows: list[Check] = [
        checks_host.check_platform(p),
        *checks_host.check_plugins(p),
        *checks_host.check_near_misses(p),
        checks_host.check_host(),
        checks_host.check_torch(p),
        *checks_host.check_torch_import(p, timeout),
        checks_host.check_driver(p),
        *checks_host.check_busy_devices(p),
        *checks_host.check_ray_devices(p),
        *checks_host.check_ray_network(p),
        *checks_host.check_kernels(p),
    ]
    imports = deep.try_imports(p, timeout) if deep_checks else None
    rows += checks_packages.check_packages(p)
    rows += checks_packages.check_pins(p, imports)
    rows += checks_packages.check_consistency(p)
    rows += checks_host.check_env(p)
    rows += checks_sandbox.check_sandbox()
    torch_imports = not any(r.name == "torch-import" and r.verdict == Verdict.FAIL for r in rows)
    rows.append(checks_lora.check_lora_sync(p, torch_imports=torch_imports))
    if deep_checks:
        assert imports is not None
        rows += deep.check_imports(imports)
        rows.append(deep.check_devices(p, timeout))
        rows.append(deep.check_collective(p, timeout))
        rows.append(deep.check_ray_listen(timeout))
    else:
        rows.append(
            skipped(
                "deep",
                "imports, device count, collective and Ray's listen addresses not run (use --deep)",
                "deep",
            )
        )
    if plan is not None or plan_error is not None:
        rows += plan_rows(plan, plan_error)
    return Report(p, rows, plan=plan, plan_error=plan_error)


_STYLE = {Verdict.PASS: "green", Verdict.WARN: "yellow", Verdict.FAIL: "bold red", Verdict.SKIP: "dim"}


def render(report: Report, console: Any, verbose: bool = False) -> None:
    """A rich table: one row per check (SKIPped optional packages only with ``verbose``)."""
    from rich.markup import escape
    from rich.table import Table

    p = report.platform
    res = p.resolution
    console.print(
        f"[bold]platform[/bold]: {escape(p.name)} ({escape(res.reason) if res else 'given by caller'})"
    )
    console.print(
        f"{p.device_count()} device(s), backend {p.dist_backend}, Ray resource {p.ray_resource}, "
        f"device {p.device_type}, "
        f"attention {p.attention_impl()}, rollout {p.rollout_engine() or 'none'}"
    )
    for name, probe in res.probes.items() if res is not None else []:
        console.print(
            f"  probe {name}: {'found' if probe.found else 'not found'}: {probe.reason}", highlight=False
        )
    if report.plan is not None:
        from rlctl.trainer.plan.render import plan_lines

        for line in plan_lines(report.plan):
            if not line.startswith("  PASS") and not line.startswith("checks:"):
                console.print(escape(line), highlight=False, soft_wrap=True)
    table = Table(show_lines=False, expand=False)
    for col in ("check", "verdict", "reason", "fix"):
        table.add_column(col, overflow="fold")
    for c in report.checks:
        if not verbose and c.verdict is Verdict.SKIP and c.category in ("packages", "pins"):
            continue
        table.add_row(
            escape(c.name), f"[{_STYLE[c.verdict]}]{c.verdict.value}[/]", escape(c.reason), escape(c.fix)
        )
    console.print(table)
    for c in report.checks:
        if c.verdict is Verdict.FAIL:
            fix = f" -> fix: {escape(c.fix)}" if c.fix else ""
            console.print(f"[bold red]FAIL[/] {escape(c.name)}: {escape(c.reason)}{fix}", soft_wrap=True)
    n = report.counts()
    console.print(
        f"{n['PASS']} pass, {n['WARN']} warn, {n['FAIL']} fail, {n['SKIP']} skip"
        + ("" if verbose else " (skipped optional packages and pins hidden; -v shows them)")
    )
