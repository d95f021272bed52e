"""``rlctl bench reshard``: planned in-memory reshard vs naive all-gather vs disk, side by side."""

from __future__ import annotations

import json
import sys

import click

from rlctl.errors import UserError


def _pairs(value: str | None) -> list[tuple[int, int]] | None:
    if not value:
        return None
    out = []
    for item in value.split(","):
        try:
            p, q = item.split(":")
            out.append((int(p), int(q)))
        except ValueError:
            raise UserError(f"--pairs: {item!r} is not P:Q (e.g. 4:2,2:2)") from None
    return out


@click.command(name="reshard")
@click.option("--json", "as_json", is_flag=True, help="Print results as JSON.")
@click.option(
    "--models", default="tiny,qwen2-0.5b,7b-scaled", show_default=True, help="Comma-separated model shapes."
)
@click.option(
    "--pairs", default=None, help="Comma-separated P:Q (train world : rollout TP); default per model."
)
@click.option(
    "--bucket-mb", default=64, show_default=True, type=int, help="Bucket size for the planned reshard."
)
@click.option(
    "--repeat", default=2, show_default=True, type=int, help="Timed repetitions (best is reported)."
)
@click.option(
    "--max-model-gb", default=1.0, show_default=True, type=float, help="Cut the 7B shape's layers to fit."
)
@click.option(
    "--rank-order", type=click.Choice(["contiguous", "strided"]), default="strided", show_default=True
)
@click.option(
    "--device",
    default="cpu",
    show_default=True,
    help="Where the ranks run: cpu (host memory, gloo) or cuda (rank r on cuda:r, nccl; one device per rank).",
)
def command(
    as_json: bool,
    models: str,
    pairs: str | None,
    bucket_mb: int,
    repeat: int,
    max_model_gb: float,
    rank_order: str,
    device: str,
) -> None:
    """Train -> rollout layout transfer: planned vs naive all-gather vs disk (spawned ranks).

    On a device, cases needing more ranks than there are devices are skipped with the reason; the
    single-process rows compare against the device's own device-to-device copy bandwidth.
    """
    from rlctl.bench.reshard import MODELS, bench, resolve_device, rows_json

    where = resolve_device(device)

    names = [m.strip() for m in models.split(",") if m.strip()]
    unknown = [m for m in names if m not in MODELS]
    if unknown:
        raise UserError(f"--models: unknown {unknown}; expected some of {sorted(MODELS)}")

    def progress(msg: str) -> None:
        if not as_json:
            click.echo(f"  running {msg}", err=True)

    skipped: list[str] = []

    def on_skip(case: str, reason: str) -> None:
        skipped.append(case)
        click.echo(f"  skipped {case} on {where.type}: {reason}", err=True)

    rows = bench(
        names,
        _pairs(pairs),
        bucket_bytes=bucket_mb << 20,
        repeat=repeat,
        max_model_bytes=int(max_model_gb * 2**30),
        rank_order=rank_order,
        progress=progress,
        device=where,
        on_skip=on_skip,
    )
    if skipped and not rows:
        raise UserError(
            f"--device {device}: none of the asked cases fits this host ({', '.join(skipped)}); "
            f"use --pairs 1:1 or --device cpu"
        )
    if as_json:
        json.dump(rows_json(rows), sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    from rich.console import Console
    from rich.table import Table

    place = "gloo" if where.on_host else f"{where.type} memory, {where.backend}"
    table = Table(title=f"rlctl bench reshard (bucket {bucket_mb} MiB, {rank_order} rollout ranks, {place})")
    for col in (
        "model",
        "p->q",
        "strategy",
        "seconds",
        "GB out",
        "GB moved",
        "GB/s",
        "of memcpy",
        "peak extra MiB/rank",
        "vs planned",
        "same output",
    ):
        table.add_column(col, justify="right" if col not in ("model", "strategy") else "left")
    planned = {(r.model, r.p, r.q): r.seconds for r in rows if r.strategy == "planned"}
    for r in rows:
        base = planned.get((r.model, r.p, r.q))
        table.add_row(
            r.model, f"{r.p}->{r.q}", r.strategy, f"{r.seconds:.4f}", f"{r.bytes_out / 1e9:.3f}",
            f"{r.bytes_moved / 1e9:.3f}", f"{r.gbps:.2f}", f"{r.frac_memcpy:.0%}" if r.frac_memcpy is not None else "-", f"{r.peak_extra_mb:.1f}",
            f"{r.seconds / base:.1f}x" if base else "-", "yes" if r.match else "NO",
        )  # fmt: skip
    console = Console()
    if not console.is_terminal:
        console = Console(width=150)
    console.print(table)
    if rows:
        bws = sorted({round(r.memcpy_gbps, 2) for r in rows})
        if where.on_host:
            click.echo(
                f"memcpy bandwidth of this host, measured in each job (GB/s): {bws[0]:.2f} .. {bws[-1]:.2f}"
            )
        else:
            click.echo(
                f"{where.type} device-to-device copy bandwidth, measured in each job (GB/s): "
                f"{bws[0]:.2f} .. {bws[-1]:.2f}; peak extra = max_memory_allocated above the ready state"
            )
