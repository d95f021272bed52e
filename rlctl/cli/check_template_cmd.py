"""``rlctl check-template MODEL``: can the model's chat template splice multi-turn episodes exactly?"""

from __future__ import annotations

import json
from dataclasses import asdict

import click

from rlctl.cli.options import json_option


@click.command("check-template")
@click.argument("model", metavar="MODEL_DIR")
@click.option(
    "--trust-remote-code", is_flag=True, help="Allow the tokenizer's own code (as model.trust_remote_code)."
)
@json_option
def check_template(model: str, trust_remote_code: bool, as_json: bool) -> None:
    """Render multi-turn conversations (plain turns, a system prompt, a tool call and its result)
    through MODEL_DIR's chat template and check that each request's rendering extends what the
    episode holds: the previous rendering, the model's answer, its stop token. That is the splice
    agent.openai_agent runs on; a template that fails it is refused by `rlctl train`. Exit 1 when
    it fails."""
    from rlctl.agents.chat import check_template as run_check
    from rlctl.trainer.setup.models import load_tokenizer

    verdict = run_check(load_tokenizer(model, trust_remote_code, where="MODEL_DIR"))
    if as_json:
        click.echo(json.dumps(asdict(verdict), indent=2))
    else:
        click.echo(f"template: {model}")
        click.echo(
            f"stop token: {verdict.stop_text!r}; tool role: {'yes' if verdict.tool_role else 'no (tool results become user turns)'}"
        )
        click.echo(
            "splice rule: each request's rendering must start with the previous request's rendering + "
            "the sampled answer + its stop token; only the rest is tokenised (context, never trained)"
        )
        click.echo(
            "reasoning blocks: kept in later turns"
            if verdict.reasoning_kept
            else "reasoning blocks: stripped from earlier turns (a thinking model's episode starts a new "
            "chain at each request: counted in agent/prefix_mismatch, only the last chain is trained)"
        )
        for name in verdict.checked:
            click.echo(f"PASS  {name}")
        for problem in verdict.problems:
            click.echo(f"FAIL  {problem}")
        click.echo(
            "ok: splices exactly" if verdict.ok else "not splice-exact: agent.openai_agent runs are refused"
        )
    if not verdict.ok:
        raise SystemExit(1)
