"""``rlctl bench step``: rlctl's sync / one_step_off / async steps (and TRL's) side by side, one run."""

from __future__ import annotations

import json

import click

MODES = ("sync", "one_step_off", "async")


@click.command(name="step")
@click.option("--against", type=click.Choice(["trl"]), default=None, help="Also run TRL's GRPOTrainer.")
@click.option("--profile", default="", help="Profile to run (default: the shipped profiles/tiny-cpu.toml).")
@click.option("--steps", default=200, show_default=True, type=click.IntRange(1))
@click.option("--val-every", default=20, show_default=True, type=click.IntRange(1))
@click.option("--modes", default=",".join(MODES), show_default=True, help="rlctl modes, comma-separated.")
@click.option("--prompts", "prompts_per_step", type=click.IntRange(1), default=None, help="Prompts per step.")
@click.option("-n", "n", type=click.IntRange(1), default=None, help="Samples per prompt.")
@click.option("--lr", type=float, default=None, help="Learning rate (default: the profile's).")
@click.option("--val-size", type=click.IntRange(1), default=None, help="Validation prompts.")
@click.option("--backend", type=click.Choice(["ray", "inprocess"]), default=None)
@click.option("--max-staleness", default=1, show_default=True, type=click.IntRange(0))
@click.option("--out", "out_dir", default="", help="Keep runs and write bench_step.png here.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
def command(
    against: str | None,
    profile: str,
    steps: int,
    val_every: int,
    modes: str,
    prompts_per_step: int | None,
    n: int | None,
    lr: float | None,
    val_size: int | None,
    backend: str | None,
    max_staleness: int,
    out_dir: str,
    as_json: bool,
) -> None:
    """s/step, samples/s, accuracy over training seconds, time to sustained 80%, matmul fraction."""
    from rlctl.bench.step import StepBenchConfig, run_step_bench

    chosen = tuple(m.strip() for m in modes.split(",") if m.strip())
    bad = [m for m in chosen if m not in MODES]
    if bad or not chosen:
        raise click.BadParameter(f"--modes takes {', '.join(MODES)}; got {modes!r}")
    if against == "trl":
        try:
            import trl  # noqa: F401
        except ImportError:
            raise click.ClickException("--against trl needs TRL: pip install 'rlctl[bench]'") from None
    cfg = StepBenchConfig(
        profile=profile,
        steps=steps,
        val_every=val_every,
        modes=chosen,
        against_trl=against == "trl",
        prompts_per_step=prompts_per_step,
        n=n,
        lr=lr,
        val_size=val_size,
        backend=backend,
        max_staleness=max_staleness,
        out_dir=out_dir,
    )
    result = run_step_bench(cfg)
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    render(result)


def _s(x: float | None, fmt: str = "{:.1f}") -> str:
    return "-" if x is None else fmt.format(x)


def render(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    shape = result["shape"]
    table = Table(
        title=(
            f"bench step: {shape['prompts_per_step']} prompts x {shape['n']}, lr {shape['lr']:g}, "
            f"{shape['val_prompts']} held-out prompts; host fp32 matmul {result['host_matmul_gflops']:.0f} GFLOP/s"
        )
    )
    equal = result.get("equal_time_s", 0.0)
    cols = (
        "run",
        "s/step",
        "samples/s",
        "x sync",
        "final acc",
        f"acc at {equal:.0f} s",
        "to 80% s",
        "matmul frac",
        "staleness",
    )
    for col in cols:
        table.add_column(col, justify="right")
    sync = next((r for r in result["rows"] if r["name"] == "sync"), None)
    for r in result["rows"]:
        table.add_row(
            r["name"],
            f"{r['s_per_step']:.3f}",
            f"{r['samples_per_s']:.0f}",
            _s(r["samples_per_s"] / sync["samples_per_s"] if sync else None, "{:.2f}"),
            _s(r["final_accuracy"], "{:.3f}"),
            _s(r.get("accuracy_at_equal_time"), "{:.3f}"),
            _s(r["time_to_sustained_s"]),
            _s(r["matmul_fraction"], "{:.3f}"),
            _s(r.get("staleness_mean"), "{:.2f}"),
        )
    console = Console()
    console.print(table)
    stages = Table(title="per-stage median seconds (off-policy modes: gen/reward overlapped)")
    names = sorted({k for r in result["rows"] for k in r["stages_s"]})
    stages.add_column("run")
    for k in names:
        stages.add_column(k, justify="right")
    for r in result["rows"]:
        if r["stages_s"]:
            stages.add_row(r["name"], *(_s(r["stages_s"].get(k), "{:.4f}") for k in names))
    console.print(stages)
    for r in result["rows"]:
        curve = ", ".join(f"{p['accuracy']:.0%} at {p['train_s']:.0f} s" for p in r["curve"])
        console.print(f"{r['name']}: {curve}")
    if result.get("png"):
        console.print(f"curves: {result['png']}")
