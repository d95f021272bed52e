"""``rlctl bench dispatch``: driver-side cost of a DP_COMPUTE_PROTO call against raw Ray, one run."""

from __future__ import annotations

import json

import click


def _floats(value: str) -> tuple[float, ...]:
    try:
        return tuple(float(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise click.BadParameter(f"expected comma-separated numbers, got {value!r}") from None


@click.command(name="dispatch")
@click.option("--sizes-mb", default="1,100", show_default=True, help="Batch sizes in MB, comma-separated.")
@click.option("--workers", default="2,4", show_default=True, help="Group sizes, comma-separated.")
@click.option("--repeats", default=5, show_default=True, type=click.IntRange(1))
@click.option("--address", default=None, help="Ray address (default: start a local Ray for the bench).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
def command(sizes_mb: str, workers: str, repeats: int, address: str | None, as_json: bool) -> None:
    """A DP_COMPUTE_PROTO identity call vs the same round trip in raw Ray vs ray.put+ray.get."""
    from rlctl.bench.dispatch import DispatchBenchConfig, run_dispatch_bench

    n_workers = tuple(int(w) for w in _floats(workers))
    if not n_workers or any(w < 1 for w in n_workers):
        raise click.BadParameter(f"--workers needs positive integers, got {workers!r}")
    cfg = DispatchBenchConfig(sizes_mb=_floats(sizes_mb), workers=n_workers, repeats=repeats, address=address)
    result = run_dispatch_bench(cfg)
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"dispatch: DP_COMPUTE_PROTO identity call, median of {repeats}")
    for col in (
        "MB",
        "workers",
        "dispatch ms",
        "raw trip ms",
        "put+get ms",
        "x trip",
        "best x trip",
        "x put+get",
    ):
        table.add_column(col, justify="right")
    for row in result["rows"]:
        table.add_row(
            f"{row['size_mb']:.1f}",
            str(row["workers"]),
            f"{row['dispatch_s'] * 1e3:.1f}",
            f"{row['raw_round_trip_s'] * 1e3:.1f}",
            f"{row['raw_put_get_s'] * 1e3:.1f}",
            f"{row['ratio_vs_round_trip']:.2f}",
            f"{row['ratio_best_vs_round_trip']:.2f}",
            f"{row['ratio_vs_put_get']:.2f}",
        )
    Console().print(table)
    click.echo(
        "x trip: dispatch / the same round trip in raw Ray (numpy chunks, plain actors); "
        "x put+get: dispatch / one ray.put+ray.get of the batch's bytes"
    )
