"""``rlctl eval PROFILE|RUN_DIR``."""

from __future__ import annotations

import json
from pathlib import Path

import click

from rlctl.cli.options import json_option, set_option
from rlctl.errors import UserError
from rlctl.profile import load_profile


def _resolve(target: str, checkpoint: str | None, overrides: tuple[str, ...]):
    """(profile, model dir): a run directory evaluates its HF export; a profile its model.path."""
    path = Path(target)
    if path.is_dir():
        if not (path / "profile.toml").is_file():
            raise UserError(f"{target}: not a run directory (no profile.toml inside)")
        profile = load_profile(path / "profile.toml", overrides)
        model = checkpoint or str(path / "hf")
    else:
        profile = load_profile(path, overrides)
        model = checkpoint or profile.model.path
    if not (Path(model) / "config.json").is_file():
        raise UserError(f"--checkpoint {model}: not an HF model directory (no config.json)")
    return profile, model


@click.command("eval")
@click.argument("target", metavar="PROFILE|RUN_DIR", type=click.Path(exists=True))
@click.option(
    "--checkpoint", default=None, help="HF model directory to evaluate (default: the run's export)."
)
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Evaluate only the first N prompts.")
@set_option
@json_option
def eval_(
    target: str, checkpoint: str | None, limit: int | None, overrides: tuple[str, ...], as_json: bool
) -> None:
    """Greedy accuracy on the validation split."""
    from rlctl.trainer.setup.evaluate import evaluate_model

    profile, model = _resolve(target, checkpoint, overrides)
    result = evaluate_model(profile, model, limit=limit) | {"model": model}
    if as_json:
        click.echo(json.dumps(result))
    else:
        acc = result.get("accuracy")
        shown = f"accuracy {acc:.3f}" if acc is not None else f"mean score {result['score_mean']:.3f}"
        click.echo(f"{model}: {shown} on {int(result['n'])} validation prompts")
