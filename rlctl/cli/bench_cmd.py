"""``rlctl bench``: side-by-side benchmarks; each lives in ``rlctl.cli.bench_<name>``."""

from __future__ import annotations

import importlib

import click

BENCHES: dict[str, str] = {
    "endpoint": "Agent endpoint: concurrent requests batched into one generate against one at a time.",
    "dispatch": "Driver-side cost of a DP_COMPUTE_PROTO call against raw ray.put/ray.get.",
    "parity": "Numerics vs a CPU float64 reference: log-probs, grads, optimiser step, rollout; PASS/WARN/FAIL.",
    "rollout": "Rollout engine tokens/s against raw model.generate.",
    "reshard": "Train -> rollout layout transfer: planned vs naive all-gather vs disk.",
    "step": "RL step time and accuracy over training seconds: sync / one_step_off / async (and TRL).",
}


class _BenchGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(BENCHES)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in BENCHES:
            return None
        module = f"rlctl.cli.bench_{cmd_name}"
        try:
            return importlib.import_module(module).command
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise

            @click.command(name=cmd_name)
            def stub() -> None:
                raise click.ClickException(f"'rlctl bench {cmd_name}' is not built yet")

            return stub

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Benchmarks"):
            formatter.write_dl(sorted(BENCHES.items()))


@click.group(cls=_BenchGroup)
def bench() -> None:
    """Benchmarks measured side by side in one run, reported as ratios."""
