"""The ``rlctl`` command: a click group whose subcommands live in their own modules.

Subcommands load lazily so ``rlctl --help`` and ``rlctl profile check`` stay fast (no torch/ray
import). Every rlctl error becomes one line on stderr and an exit code: 2 for bad input,
1 for runtime failures. ``--debug`` shows the traceback.
"""

from __future__ import annotations

import importlib
import sys
import traceback

import click

from rlctl import __version__
from rlctl.errors import RlctlError, Stopped
from rlctl.log import configure

# name -> (module, attribute, one-line help)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "profile": ("rlctl.cli.profile_cmd", "profile", "Show or validate profiles."),
    "train": ("rlctl.cli.train_cmd", "train", "Run RL post-training from a profile."),
    "sft": ("rlctl.cli.sft_cmd", "sft", "Supervised warm-up from a profile."),
    "eval": ("rlctl.cli.eval_cmd", "eval_", "Greedy accuracy on the validation split."),
    "report": ("rlctl.cli.report_cmd", "report", "Plots and a summary of a run directory."),
    "doctor": ("rlctl.cli.doctor_cmd", "doctor", "Check drivers, engines and version pins."),
    "plan": ("rlctl.cli.plan_cmd", "plan", "The run a profile resolves to: engines, memory, fit checks."),
    "bench": ("rlctl.cli.bench_cmd", "bench", "Side-by-side benchmarks."),
    "check-template": (
        "rlctl.cli.check_template_cmd",
        "check_template",
        "Check that a chat template splices multi-turn episodes exactly.",
    ),
    "model": ("rlctl.cli.model_cmd", "model", "Build the built-in tiny models; import GGUF checkpoints."),
}


def _not_built(name: str, reason: str) -> click.Command:
    @click.command(name=name, context_settings={"ignore_unknown_options": True})
    @click.argument("args", nargs=-1, type=click.UNPROCESSED)
    def stub(args: tuple[str, ...]) -> None:
        raise click.ClickException(f"'rlctl {name}' is not built yet ({reason})")

    stub.help = f"(not built yet) {COMMANDS[name][2]}"
    return stub


class LazyGroup(click.Group):
    """Imports a subcommand's module only when that subcommand runs."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        module, attr, _ = COMMANDS[cmd_name]
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name == module:
                return _not_built(cmd_name, f"module {module} is missing")
            raise
        return getattr(mod, attr)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, COMMANDS[name][2]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="rlctl")
@click.option("--debug", is_flag=True, help="Show tracebacks for errors.")
@click.option(
    "--log-format",
    type=click.Choice(["auto", "console", "plain", "json"]),
    default="auto",
    show_default=True,
    help="Log rendering on stderr; json is one object per line.",
)
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="info")
@click.pass_context
def cli(ctx: click.Context, debug: bool, log_format: str, log_level: str) -> None:
    """rlctl: RL post-training for LLMs on any hardware, from one TOML profile."""
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug
    configure(log_format, log_level)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: maps errors to exit codes without tracebacks."""
    args = sys.argv[1:] if argv is None else argv
    debug = "--debug" in args
    try:
        rv = cli.main(args=args, prog_name="rlctl", standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("rlctl: aborted", err=True)
        sys.exit(130)
    except click.UsageError as exc:
        if debug:
            traceback.print_exc()
        hint = f" (see '{exc.ctx.command_path} --help')" if exc.ctx else ""
        click.echo(f"rlctl: error: {exc.format_message()}{hint}", err=True)
        sys.exit(2)
    except click.ClickException as exc:
        if debug:
            traceback.print_exc()
        click.echo(f"rlctl: error: {exc.format_message()}", err=True)
        sys.exit(exc.exit_code)
    except Stopped as exc:
        click.echo(f"rlctl: {exc}", err=True)
        sys.exit(exc.exit_code)
    except RlctlError as exc:
        if debug:
            traceback.print_exc()
        headline, _, details = str(exc).partition("\n")
        if details and debug:
            click.echo(details, err=True)
        hint = " (--debug shows the remote traceback)" if details and not debug else ""
        click.echo(f"rlctl: error: {headline}{hint}", err=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        click.echo("rlctl: interrupted", err=True)
        sys.exit(130)
    except Exception as exc:  # an rlctl bug or an unexpected runtime failure
        if debug:
            traceback.print_exc()
        click.echo(
            f"rlctl: error: {type(exc).__name__}: {exc} (run with --debug for the traceback)", err=True
        )
        sys.exit(1)
    sys.exit(rv if isinstance(rv, int) else 0)


if __name__ == "__main__":
    main()
