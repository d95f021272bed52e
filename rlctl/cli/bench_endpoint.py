"""``rlctl bench endpoint``: the agent endpoint's request batching against one request at a time."""

from __future__ import annotations

import json

import click


@click.command(name="endpoint")
@click.option(
    "--model",
    type=click.Path(exists=True, file_okay=False),
    help="Local HF model dir (default: builtin tiny-1m).",
)
@click.option("--episodes", default=64, show_default=True, type=click.IntRange(1))
@click.option("--turns", default=4, show_default=True, type=click.IntRange(1))
@click.option("--answer-tokens", default=32, show_default=True, type=click.IntRange(1))
@click.option("--repeats", default=3, show_default=True, type=click.IntRange(1))
@click.option("--threads", type=click.IntRange(1), help="torch CPU threads (default: torch's choice).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
def command(threads: int | None, as_json: bool, **options) -> None:
    """Episodes of OpenAI-client agents through the endpoint: batched against serial, same engine."""
    import torch

    from rlctl.bench.endpoint import EndpointBenchConfig, run_endpoint_bench
    from rlctl.errors import UserError

    try:
        import openai  # noqa: F401
    except ImportError:
        raise UserError("rlctl bench endpoint runs the openai client: pip install 'rlctl[agent]'") from None
    if threads:
        torch.set_num_threads(threads)
    result = run_endpoint_bench(EndpointBenchConfig(**options))
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    cfg = result["config"]
    click.echo(
        f"endpoint: {cfg['episodes']} episodes x {cfg['turns']} turns = {result['requests']} requests, "
        f"{cfg['answer_tokens']} tokens per answer at most"
    )
    for side in ("batched", "serial"):
        r = result[side]
        click.echo(
            f"{side:8s} median {r['median_s']:.2f} s  {r['requests_per_s']:.1f} requests/s  "
            f"engine calls {r['engine_calls']}  trajectories complete and exact: {r['complete_and_exact']}"
        )
    click.echo(f"ratio batched/serial throughput: {result['ratio']:.2f}x")
