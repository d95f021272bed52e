"""``rlctl bench rollout``: rollout engine tokens/s against raw ``model.generate``, side by side."""

from __future__ import annotations

import json

import click


@click.command(name="rollout")
@click.option(
    "--model",
    type=click.Path(exists=True, file_okay=False),
    help="Local HF model dir (default: random Qwen2).",
)
@click.option("--device", default="cpu", show_default=True)
@click.option("--dtype", default="float32", show_default=True)
@click.option("--batch", default=8, show_default=True, type=click.IntRange(1))
@click.option("--prompt-len", default=32, show_default=True, type=click.IntRange(1))
@click.option("--new-tokens", default=32, show_default=True, type=click.IntRange(1))
@click.option("--temperature", default=1.0, show_default=True, type=click.FloatRange(min=0, min_open=True))
@click.option("--top-p", default=1.0, show_default=True, type=click.FloatRange(0, 1, min_open=True))
@click.option("--top-k", default=0, show_default=True, type=click.IntRange(0))
@click.option("--repeats", default=5, show_default=True, type=click.IntRange(1))
@click.option("--warmup", default=1, show_default=True, type=click.IntRange(0))
@click.option("--hidden-size", default=256, show_default=True, type=click.IntRange(8))
@click.option("--layers", default=2, show_default=True, type=click.IntRange(1))
@click.option("--vocab-size", default=4096, show_default=True, type=click.IntRange(2))
@click.option("--threads", type=click.IntRange(1), help="torch CPU threads (default: torch's choice).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
def command(threads: int | None, as_json: bool, **options) -> None:
    """Rollout engine tokens/s against raw model.generate (same model, batch and lengths)."""
    import torch

    from rlctl.bench.rollout import RolloutBenchConfig, run_rollout_bench

    if threads:
        torch.set_num_threads(threads)
    result = run_rollout_bench(RolloutBenchConfig(**options))
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    cfg = result["config"]
    table = Table(
        title=f"rollout: batch {cfg['batch']}, prompt {cfg['prompt_len']}, new {cfg['new_tokens']}, {cfg['device']}"
    )
    table.add_column("side")
    table.add_column("tokens/s", justify="right")
    table.add_column("median s", justify="right")
    for side in ("engine", "generate"):
        secs = sorted(result[f"{side}_seconds"])[len(result[f"{side}_seconds"]) // 2]
        table.add_row(side, f"{result[f'{side}_tokens_per_s']:.1f}", f"{secs:.3f}")
    Console().print(table)
    click.echo(f"ratio engine/generate: {result['ratio']:.3f}")
