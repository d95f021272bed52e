"""``rlctl bench reshard``: the planned reshard, the weight syncs peers ship and the trainer's own
sync, side by side, every output checked exactly."""

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


def _strategies(value: str) -> tuple[str, ...]:
    from rlctl.bench.reshard import STRATEGIES

    names = tuple(s.strip() for s in value.split(",") if s.strip())
    unknown = [s for s in names if s not in STRATEGIES]
    if unknown or "planned" not in names:
        raise UserError(f"--strategies: {value!r}; expected 'planned' plus some of {list(STRATEGIES[1:])}")
    return names


@click.command(name="reshard")
@click.option("--json", "as_json", is_flag=True, help="Print results as JSON.")
@click.option(
    "--models", default="tiny,qwen2-0.5b,llama2-7b", show_default=True, help="Comma-separated model shapes."
)
@click.option(
    "--pairs", default=None, help="Comma-separated P:Q (train world : rollout TP); default per model."
)
@click.option(
    "--strategies",
    default="planned,verl,openrlhf,trl,disk,trainer",
    show_default=True,
    help="planned plus peers (verl, openrlhf, trl), disk and the trainer's own sync (at q > 1 into the HF engine's TP shards, beside planned and verl into the same layout).",
)
@click.option("--bucket-mb", default=64, show_default=True, type=int, help="Bucket size (planned and verl).")
@click.option(
    "--repeat", default=2, show_default=True, type=int, help="Timed repetitions (best is reported)."
)
@click.option(
    "--max-model-gb",
    default=None,
    type=float,
    help="Cut decoder layers to fit this; default: what fits half of this host's available memory.",
)
@click.option(
    "--rank-order", type=click.Choice(["contiguous", "strided"]), default="contiguous", show_default=True,
    help="Rollout TP groups: contiguous (what vLLM and the trainer launch) or HybridFlow-strided.",
)  # fmt: skip
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
    strategies: str,
    bucket_mb: int,
    repeat: int,
    max_model_gb: float | None,
    rank_order: str,
    device: str,
) -> None:
    """Train -> rollout weight sync: planned vs verl / OpenRLHF / TRL / disk vs the trainer's sync.

    Every rank's output is checked tensor by tensor (SHA-256) against what the rollout engine loads;
    a mismatch fails the command. On a device, cases needing more ranks than devices are skipped
    with the reason, and only planned and disk run (the peer models and the trainer row are host-only).
    """
    from rlctl.bench.reshard import MODELS, bench, resolve_device, resolve_model, rows_json

    where = resolve_device(device)
    names = [resolve_model(m.strip()) for m in models.split(",") if m.strip()]
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
        max_model_bytes=int(max_model_gb * 2**30) if max_model_gb else None,
        rank_order=rank_order,
        strategies=_strategies(strategies),
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
    _print(rows, where, bucket_mb, rank_order)


def _print(rows, where, bucket_mb: int, rank_order: str) -> None:
    from rich.console import Console
    from rich.table import Table

    from rlctl.bench.reshard import layer_costs, peer_ratios

    place = "host memory, gloo" if where.on_host else f"{where.type} memory, {where.backend}"
    table = Table(
        title=f"rlctl bench reshard ({place}; bucket {bucket_mb} MiB; {rank_order} rollout TP ranks; "
        "every tensor of every rank SHA-256-checked)"
    )
    cols = ("model", "layers", "params", "GB", "p->q", "layout", "strategy", "transport", "seconds",
            "GB/s out", "of link", "peak MiB/rank", "x planned", "checked")  # fmt: skip
    for col in cols:
        table.add_column(
            col, justify="left" if col in ("model", "layout", "strategy", "transport") else "right"
        )
    ratios = peer_ratios(rows)
    for r in rows:
        ratio = ratios.get((r.model, r.layers_kept, r.p, r.q), {}).get(r.strategy)
        link = r.frac_loopback if r.frac_loopback is not None else r.frac_memcpy
        table.add_row(
            r.model, f"{r.layers_kept}/{r.layers_full}", f"{r.params / 1e6:.0f}M", f"{r.model_bytes / 1e9:.2f}",
            f"{r.p}->{r.q}", r.fmt if r.fmt == "hf" else f"{'hf' if r.fmt == 'hf_tp' else 'vllm'} tp{r.q}", r.strategy, r.transport,
            f"{r.seconds:.3f}", f"{r.gbps:.2f}", f"{link:.0%}" if link is not None else "-",
            f"{r.peak_extra_mb:.0f}", f"{ratio:.1f}x" if ratio else "-", "yes" if r.match else "NO",
        )  # fmt: skip
    console = Console()
    if not console.is_terminal:
        console = Console(width=190)
    console.print(table)
    if not rows:
        return
    loops = sorted(r.loopback_gbps for r in rows if r.loopback_gbps)
    bws = sorted(r.memcpy_gbps for r in rows)
    if loops:
        click.echo(
            f"link: gloo loopback, 64 MiB batch_isend_irecv ring among the job's ranks, per-rank receive rate "
            f"{loops[0]:.2f} .. {loops[-1]:.2f} GB/s; 'of link' = busiest rank's received bytes at that rate / "
            "seconds (1 rank: of memcpy)"
        )
    click.echo(f"memcpy of one process, measured in each job: {bws[0]:.2f} .. {bws[-1]:.2f} GB/s")
    for (model, layers, p, q, fmt), by in ratios.items():
        peers = {s: x for s, x in by.items() if s in ("verl", "openrlhf", "trl")}
        if peers:
            best = min(peers, key=peers.get)
            click.echo(
                f"{model} ({layers} layers) p={p}->q={q} {fmt}: planned is {peers[best]:.2f}x the best peer ({best})"
            )
        if "trainer" in by and "verl" in by and fmt == "hf_tp":
            click.echo(
                f"{model} ({layers} layers) p={p}->q={q} {fmt}: the loop's sync is "
                f"{by['verl'] / by['trainer']:.2f}x faster than verl's full-gather buckets into the same shards"
            )
    for c in layer_costs(rows):
        click.echo(
            f"per layer: {c.model} p={c.p}->q={c.q} {c.strategy}: {c.per_layer_s * 1e3:.0f} ms/layer + "
            f"{c.fixed_s * 1e3:.0f} ms fixed (line through {c.depths[0]} and {c.depths[1]} layers, "
            f"{c.seconds[0]:.3f} s / {c.seconds[1]:.3f} s); read off at {c.layers_full} layers: {c.full_model_s:.2f} s"
        )
