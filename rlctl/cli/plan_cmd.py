"""``rlctl plan PROFILE [--hardware DEVICE:N] [--json]``: the run as it will be built, its memory
per device and every fit check, on this host or on a target cluster."""

from __future__ import annotations

import json
import sys

import click

from rlctl.cli.options import json_option, set_option


@click.command(name="plan")
@click.argument("profile_path", metavar="PROFILE", type=click.Path(dir_okay=False))
@set_option
@click.option(
    "--hardware",
    default=None,
    metavar="DEVICE[:N]",
    help="Plan for N devices per node of DEVICE (h100, h200, b200, a100, mi300x, mi325x, 910b, 910c, "
    "cpu) instead of this host; cluster.nodes comes from the profile.",
)
@json_option
@click.pass_context
def plan(
    ctx: click.Context, profile_path: str, overrides: tuple[str, ...], hardware: str | None, as_json: bool
) -> None:
    """Resolve PROFILE into the run plan; exit 1 when a check FAILs."""
    from rlctl.errors import UserError
    from rlctl.platforms.catalogue import parse_hardware
    from rlctl.profile import load_profile
    from rlctl.trainer.plan.render import plan_lines
    from rlctl.trainer.plan.run_plan import resolve_plan

    profile = load_profile(profile_path, overrides)
    target = parse_hardware(hardware) if hardware else None
    try:
        run_plan = resolve_plan(profile, hardware=target)
    except UserError as exc:
        if target is None and "is not usable here" in str(exc):
            raise UserError(f"{exc}; plan for that hardware with --hardware DEVICE:N") from None
        raise
    if as_json:
        sys.stdout.write(json.dumps(run_plan.to_dict(), indent=2, default=str) + "\n")
    else:
        click.echo("\n".join(plan_lines(run_plan)))
    ctx.exit(1 if run_plan.failures else 0)
