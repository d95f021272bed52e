"""``rlctl doctor``: is this host ready for an RL run? Verdicts and fixes, table or JSON."""

from __future__ import annotations

import json
import sys

import click

from rlctl.errors import RlctlError
from rlctl.log import get_logger


def _json_error(message: str, exit_code: int) -> None:
    """The JSON document ``--json`` promises, for a run that stopped before any check."""
    doc = {"error": message, "exit_code": exit_code, "platform": None, "checks": [], "summary": {}}
    sys.stdout.write(json.dumps(doc, indent=2) + "\n")


class _JsonAwareCommand(click.Command):
    """With ``--json`` on the command line, a usage error still prints one JSON document (the
    one-line message on stderr and exit code 2 stay as for every rlctl command)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        wants_json = "--json" in args
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as exc:
            if wants_json:
                _json_error(f"usage: {exc.format_message()}", exc.exit_code)
            raise


@click.command(name="doctor", cls=_JsonAwareCommand)
@click.option(
    "--json", "as_json", is_flag=True, help="Print one JSON document to stdout (logs go to stderr)."
)
@click.option("--deep", is_flag=True, help="Also import engines, count devices, run a collective (slower).")
@click.option(
    "--vendor", default="auto", show_default=True, help="Platform to check (overrides RLCTL_PLATFORM)."
)
@click.option(
    "--profile",
    "profile_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Check the run this profile resolves to (its platform, engines, pins, memory: the plan "
    "`rlctl train` builds); --vendor other than auto checks that platform only.",
)
@click.option("--timeout", default=120.0, show_default=True, help="Seconds for each --deep child process.")
@click.option("-v", "--verbose", is_flag=True, help="Show skipped optional packages and pins too.")
@click.pass_context
def doctor(
    ctx: click.Context,
    as_json: bool,
    deep: bool,
    vendor: str,
    profile_path: str | None,
    timeout: float,
    verbose: bool,
) -> None:
    """Check drivers, torch build, engines and version pins; exit 1 if anything FAILs."""
    from rlctl.doctor.runner import render, run_doctor
    from rlctl.platforms import resolve_platform

    log = get_logger("rlctl.doctor")
    plan, plan_error = None, None
    try:
        if profile_path and vendor == "auto":
            from rlctl.profile import load_profile
            from rlctl.trainer.plan.run_plan import resolve_plan

            profile = load_profile(profile_path)
            vendor = profile.platform.vendor
            try:  # the run's own resolution: doctor shows the plan `rlctl train` would build
                plan = resolve_plan(profile)
            except RlctlError as exc:
                plan_error = str(exc).partition("\n")[0]
        platform = plan.platform_object if plan is not None else resolve_platform(vendor)
    except RlctlError as exc:
        if as_json:
            _json_error(str(exc).partition("\n")[0], exc.exit_code)
        raise
    log.debug("platform resolved", platform=platform.name, reason=platform.resolution.reason)
    if deep:
        log.info("running deep checks", timeout_s=timeout)
    report = run_doctor(platform, deep_checks=deep, timeout=timeout, plan=plan, plan_error=plan_error)
    if as_json:
        sys.stdout.write(json.dumps(report.to_dict(), indent=2, default=str) + "\n")
    else:
        from rich.console import Console

        # a wide console when piped (CI logs) so reasons are not chopped into 80 columns
        render(report, Console(width=None if sys.stdout.isatty() else 200), verbose=verbose)
    ctx.exit(report.exit_code)
