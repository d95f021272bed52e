"""``rlctl report RUN_DIR``: PNG plots and a short summary of a run's metrics.jsonl."""

from __future__ import annotations

import json
import sys

import click


@click.command(name="report")
@click.argument("run_dir", type=click.Path(path_type=str))
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=str), default=None,
              help="Folder for the PNGs and report.md  [default: RUN_DIR/plots, report.md in RUN_DIR]")  # fmt: skip
@click.option("--threshold", type=click.FloatRange(0.0, 1.0), default=0.8, show_default=True,
              help="Validation accuracy target the summary reports reaching and holding.")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print the summary as one JSON object on stdout.")
def report(run_dir: str, out_dir: str | None, threshold: float, as_json: bool) -> None:
    """Plots (reward, validation accuracy, KL, entropy, response length, seconds per stage) and a summary."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from rlctl.report import build_report, summary_text
    from rlctl.report.plots import PLOTS

    err = Console(stderr=True)
    with Progress(
        TextColumn("plotting {task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        console=err,
        transient=True,
        disable=not err.is_terminal,
    ) as progress:
        task = progress.add_task("", total=len(PLOTS))

        def step(name: str) -> None:
            progress.update(task, description=name, completed=list(PLOTS).index(name))

        result = build_report(run_dir, out_dir=out_dir, threshold=threshold, on_progress=step)
        progress.update(task, completed=len(PLOTS))
    if as_json:
        sys.stdout.write(json.dumps(result.to_dict(), indent=2) + "\n")
        return
    click.echo(summary_text(result.summary))
    where = result.plots[0].parent if result.plots else "-"
    click.echo(f"plots: {len(result.plots)} in {where}; report: {result.markdown}")
    click.echo(f"samples: {result.sample_rows} rows in the report's tables" if result.sample_rows else
               "samples: none recorded (trainer.log_samples = 0, or an older run)")  # fmt: skip
    if result.skipped:
        click.echo(f"no data for: {', '.join(result.skipped)}")
