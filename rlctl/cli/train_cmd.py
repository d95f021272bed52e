"""``rlctl train PROFILE``."""

from __future__ import annotations

from pathlib import Path

import click

from rlctl.cli.options import set_option
from rlctl.profile import load_profile


@click.command()
@click.argument("profile_path", metavar="PROFILE", type=click.Path(dir_okay=False))
@set_option
@click.option("--output-dir", default=None, help="Parent of the run directory (default: run.output_dir).")
@click.option("--max-steps", type=click.IntRange(min=1), default=None, help="Stop after this many steps.")
@click.option(
    "--resume",
    default="auto",
    show_default=True,
    metavar="auto|never|PATH",
    help=(
        "auto: continue from the run's latest checkpoint (fresh if none). never: start fresh; an "
        "existing RUN_DIR/checkpoints/ and metrics.jsonl are moved aside to checkpoints.prev-<time>/ "
        "and metrics.prev-<time>.jsonl (logged, never deleted). PATH: continue from that "
        "RUN_DIR/checkpoints/step_* directory, on any number of devices (sharded state is resharded); "
        "the run directory's other checkpoints are moved aside unless PATH is its latest."
    ),
)
def train(
    profile_path: str, overrides: tuple[str, ...], output_dir: str | None, max_steps: int | None, resume: str
) -> None:
    """Run RL post-training from PROFILE."""
    from rlctl.trainer.run import train as run_training

    profile = load_profile(profile_path, overrides)
    last = run_training(profile, output_dir=output_dir, max_steps=max_steps, resume=resume)
    run_dir = Path(output_dir or profile.run.output_dir) / profile.run.name
    acc = last.get("val/accuracy")
    shown = f", held-out accuracy {acc:.3f}" if acc is not None else ""
    click.echo(f"done: {run_dir}{shown}; plots: rlctl report {run_dir}")
