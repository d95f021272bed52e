"""``rlctl bench parity``: this platform's numerics (log-probs, entropy, loss, gradients, one optimiser
step, the rollout engine's log-probs) against a CPU float64 reference of the same weights."""

from __future__ import annotations

import json
from pathlib import Path

import click

DTYPES = ("float32", "bfloat16", "float16")


@click.command(name="parity")
@click.argument("profile", required=False, type=click.Path(exists=True, dir_okay=False))
@click.option("--device", default=None, help="Device to measure (default: the profile's platform's).")
@click.option(
    "--dtypes", default="float32,bfloat16", show_default=True, help="Comma-separated compute dtypes."
)
@click.option("--batch", default=4, show_default=True, type=click.IntRange(1), help="Sequences sampled.")
@click.option("--prompt-len", default=16, show_default=True, type=click.IntRange(1))
@click.option("--response-len", default=32, show_default=True, type=click.IntRange(1))
@click.option("--seed", default=0, show_default=True, type=int)
@click.option(
    "--out", "out_dir", default="runs/bench-parity", show_default=True, help="Where parity_hist.png goes."
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object on stdout.")
@click.option(
    "--compare",
    nargs=2,
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="Put two saved --json reports side by side (measures nothing).",
)
def command(
    profile: str | None,
    device: str | None,
    dtypes: str,
    batch: int,
    prompt_len: int,
    response_len: int,
    seed: int,
    out_dir: str,
    as_json: bool,
    compare: tuple[str, str] | None,
) -> None:
    """Log-probs, entropy, loss, per-layer grad norms, one optimiser step and the rollout engine's
    log-probs, each against float64 on the CPU; PASS/WARN/FAIL per dtype. Exit 1 on any FAIL.

    PROFILE defaults to the built-in tiny model's profiles/tiny-cpu.toml and, once imported,
    SmolLM2's profiles/smollm2-cpu.toml."""
    from rlctl.bench import parity_report

    if compare:
        a, b = (parity_report.load(p) for p in compare)
        if as_json:
            click.echo(
                json.dumps({"a": compare[0], "b": compare[1], "rows": parity_report.compare(a, b)}, indent=2)
            )
        else:
            parity_report.render_compare(a, b, (compare[0], compare[1]))
        return
    chosen = tuple(d.strip() for d in dtypes.split(",") if d.strip())
    bad = [d for d in chosen if d not in DTYPES]
    if bad or not chosen:
        raise click.BadParameter(
            f"expected a comma-separated subset of {', '.join(DTYPES)}; got {dtypes!r}", param_hint="--dtypes"
        )
    from rlctl.bench.parity import ParitySettings, run_case
    from rlctl.bench.parity_env import default_profiles, resolve_case

    paths = [Path(profile)] if profile else default_profiles()
    if not paths:
        raise click.ClickException("no profile given and the built-in tiny model's profile is missing")
    settings = ParitySettings(
        dtypes=chosen, batch=batch, prompt_len=prompt_len, response_len=response_len, seed=seed
    )
    report = [run_case(resolve_case(p, device), settings) for p in paths]
    png = parity_report.histogram(report, Path(out_dir) / "parity_hist.png")
    if as_json:
        cases = [
            {**c, "results": [{k: v for k, v in r.items() if k != "log_prob_diffs"} for r in c["results"]]}
            for c in report
        ]
        click.echo(json.dumps({"cases": cases, "histogram": str(png)}, indent=2))
    else:
        parity_report.render(report)
        click.echo(f"histogram: {png}")
    if any(r["verdict"] == "FAIL" for c in report for r in c["results"]):
        raise SystemExit(1)
