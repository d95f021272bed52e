"""``rlctl sft PROFILE``."""

from __future__ import annotations

import json

import click

from rlctl.cli.options import json_option, set_option
from rlctl.profile import load_profile


@click.command()
@click.argument("profile_path", metavar="PROFILE", type=click.Path(dir_okay=False))
@set_option
@click.option("--output-dir", default=None, help="Parent of the run directory (default: run.output_dir).")
@json_option
def sft(profile_path: str, overrides: tuple[str, ...], output_dir: str | None, as_json: bool) -> None:
    """Supervised warm-up of PROFILE's model on its dataset (answers from the data)."""
    from rlctl.tracking.run_files import RunLock, prepare_run_dir
    from rlctl.trainer.run import run_dir_for
    from rlctl.trainer.sft import run_sft

    profile = load_profile(profile_path, overrides)
    run_dir = prepare_run_dir(run_dir_for(profile, output_dir))
    with RunLock(run_dir):
        result = run_sft(profile, run_dir)
    if as_json:
        click.echo(json.dumps(result))
    else:
        click.echo(f"sft done: {result}")
