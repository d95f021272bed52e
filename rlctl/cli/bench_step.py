"""``rlctl bench step``: rlctl's sync / one_step_off / async steps (and TRL's, and another rlctl
version's) side by side in one invocation, over one or more seeds."""

from __future__ import annotations

import json

import click

from rlctl.bench.step_common import MODES, ROWS, VARIANTS


@click.command(name="step")
@click.option("--against", type=click.Choice(["trl"]), default=None, help="Also run TRL's GRPOTrainer.")
@click.option("--profile", default="", help="Profile to run (default: the shipped profiles/tiny-cpu.toml).")
@click.option("--steps", default=200, show_default=True, type=click.IntRange(1))
@click.option("--val-every", default=20, show_default=True, type=click.IntRange(1))
@click.option(
    "--modes",
    default=",".join(MODES),
    show_default=True,
    help=f"rlctl modes, comma-separated; also {', '.join(VARIANTS)} (async with in-flight swaps / carried partial rollouts / delta pushes).",
)
@click.option("--prompts", "prompts_per_step", type=click.IntRange(1), default=None, help="Prompts per step.")
@click.option("-n", "n", type=click.IntRange(1), default=None, help="Samples per prompt.")
@click.option("--lr", type=float, default=None, help="Learning rate (default: the profile's).")
@click.option("--val-size", type=click.IntRange(1), default=None, help="Validation prompts.")
@click.option("--backend", type=click.Choice(["ray", "inprocess"]), default=None)
@click.option("--max-staleness", default=1, show_default=True, type=click.IntRange(0))
@click.option(
    "--seeds",
    default=1,
    show_default=True,
    type=click.IntRange(1),
    help="Runs per row (run.seed + 0..k-1); medians.",
)
@click.option(
    "--baseline",
    default="",
    metavar="DIR",
    help="An rlctl checkout whose bench runs alongside (rows baseline-<mode>).",
)
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
    seeds: int,
    baseline: str,
    out_dir: str,
    as_json: bool,
) -> None:
    """s/step, samples/s, accuracy over training seconds, time to sustained 80% (medians over
    --seeds), and per stage: seconds, model FLOPs, fraction of the host's measured matmul rate and
    the floor at that rate. --baseline DIR runs the same bench with the rlctl checkout in DIR
    (e.g. `git worktree add /tmp/rlctl-prev <commit>`) and reports <mode>_s_per_step_vs_baseline."""
    from rlctl.bench.step import StepBenchConfig, run_step_bench
    from rlctl.bench.step_baseline import check_baseline

    chosen = tuple(m.strip() for m in modes.split(",") if m.strip())
    bad = [m for m in chosen if m not in ROWS]
    if bad or not chosen:
        raise click.BadParameter(f"--modes takes {', '.join(ROWS)}; got {modes!r}")
    if baseline:
        check_baseline(baseline)
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
        seeds=seeds,
        baseline=baseline,
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
    model_gemm = result.get("host_matmul_model_shape") or {}
    at_model = (
        f", {model_gemm['gflops']:.0f} at [{model_gemm['m']}x{model_gemm['k']}]@[{model_gemm['k']}x{model_gemm['n']}]"
        if model_gemm
        else ""
    )
    seeds = result.get("seeds", [])
    table = Table(
        title=(
            f"bench step: {shape['prompts_per_step']} prompts x {shape['n']}, lr {shape['lr']:g}, "
            f"{shape['val_prompts']} held-out prompts, {len(seeds)} seed(s) (medians); "
            f"host fp32 matmul {result['host_matmul_gflops']:.0f} GFLOP/s (1024^3){at_model}"
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
        "reached",
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
            r.get("reached", "-"),
            _s(r["matmul_fraction"], "{:.3f}"),
            _s(r.get("staleness_mean"), "{:.2f}"),
        )
    console = Console()
    console.print(table)
    console.print(stage_table(result))
    bare = result.get("bare_model")
    if bare:
        console.print(
            f"bare model (plain transformers at these shapes, {bare['prompt_tokens']} prompt + "
            f"{bare['response_tokens']:.2f} response tokens a row, update over {bare['update_prompts']} of "
            f"{bare['prompts']} groups): gen {bare['gen_s']:.4f} + update {bare['update_s']:.4f} = "
            f"{bare['step_s']:.4f} s/step on {bare['threads']} threads"
        )
        if "overlapped_step_s" in bare:
            rollout, train = bare["split_threads"]
            console.print(
                f"overlapped (gen on {rollout}, update on {train} threads at once): "
                f"max({bare['gen_split_s']:.4f}, {bare['update_split_s']:.4f}) = {bare['overlapped_step_s']:.4f} s/step"
            )
        for r in result["rows"]:
            ratio = result["ratios"].get(f"{r['name']}_s_per_step_vs_bare_model")
            if ratio is not None:
                console.print(f"{r['name']}: {ratio:.2f}x the bare model's s/step (the lower of the two)")
    for name, value in result.get("ratios", {}).items():
        if name.endswith("_vs_baseline"):
            console.print(f"{name}: {value:.3f}")
    for r in result["rows"]:
        curve = ", ".join(f"{p['accuracy']:.0%} at {p['train_s']:.0f} s" for p in r["curve"])
        console.print(f"{r['name']} (seed {r.get('curve_seed', '-')}): {curve}")
    if result.get("png"):
        console.print(f"curves: {result['png']}")


def stage_table(result: dict):
    """Per row and stage: median seconds, model GFLOP, fraction of the host's matmul rate, floor."""
    from rich.table import Table

    table = Table(
        title="per stage: median s / GFLOP / fraction of the GEMM rate measured before the run / floor s "
        "(off-policy modes: gen/reward overlapped; trl gen = generate + score; update_actor counts "
        "the tokens it forwarded: rows without a gradient are skipped)"
    )
    for col in ("run", "GEMM GFLOP/s", "stage", "s", "GFLOP", "fraction", "floor s"):
        table.add_column(col, justify="right")
    for r in result["rows"]:
        for stage, w in r.get("stage_work", {}).items():
            table.add_row(
                r["name"],
                _s(r.get("host_matmul_gflops"), "{:.0f}"),
                stage,
                f"{w['seconds']:.4f}",
                _s(w["gflop"], "{:.2f}"),
                _s(w["fraction"], "{:.3f}"),
                _s(w["floor_s"], "{:.4f}"),
            )
    return table
