"""``rlctl profile show|check|keys``."""

from __future__ import annotations

import dataclasses
import json

import click

from rlctl.cli.options import json_option, set_option
from rlctl.errors import UserError
from rlctl.profile import load_profile, profile_to_dict, profile_to_toml
from rlctl.profile.fields import describe_range
from rlctl.profile.schema import SECTIONS


@click.group()
def profile() -> None:
    """Show or validate profiles."""


@profile.command()
@click.argument("path", type=click.Path(dir_okay=False))
@set_option
@json_option
def show(path: str, overrides: tuple[str, ...], as_json: bool) -> None:
    """Print the fully resolved PROFILE (extends, preset and --set applied)."""
    prof = load_profile(path, overrides)
    if as_json:
        click.echo(json.dumps(profile_to_dict(prof), indent=2))
    else:
        click.echo(f"# resolved from {path}", nl=True)
        click.echo(profile_to_toml(prof), nl=False)


@profile.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(dir_okay=False))
@set_option
def check(paths: tuple[str, ...], overrides: tuple[str, ...]) -> None:
    """Validate each profile; exit 0 only if all are valid."""
    failures = 0
    for path in paths:
        try:
            load_profile(path, overrides)
            click.echo(f"ok      {path}")
        except UserError as exc:
            failures += 1
            click.echo(f"rlctl: error: {exc}", err=True)
    if failures:
        raise click.exceptions.Exit(2)


@profile.command()
@json_option
def keys(as_json: bool) -> None:
    """List every profile key with its default, allowed values and meaning."""
    rows = []
    for name, cls in SECTIONS.items():
        inst = cls()
        for f in dataclasses.fields(cls):
            rows.append(
                {
                    "key": f"{name}.{f.name}",
                    "default": getattr(inst, f.name),
                    "allowed": describe_range(dict(f.metadata)),
                    "help": f.metadata["help"],
                }
            )
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    for row in rows:
        allowed = f" [{row['allowed']}]" if row["allowed"] else ""
        click.echo(f"{row['key']:38} = {row['default']!r:18} {row['help']}{allowed}")
