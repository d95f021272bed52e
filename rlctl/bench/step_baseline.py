"""``rlctl bench step --baseline DIR``: the same bench run by another rlctl version, side by side.

``DIR`` is a checkout of that version (``git worktree add /tmp/rlctl-prev <commit>``). For each
seed it runs ``python -m rlctl.cli.main bench step --json`` in a subprocess with
``PYTHONPATH=DIR`` and ``DIR`` as working directory (``-m`` puts the working directory first on
``sys.path``), on the same profile (an absolute path; profiles resolve ``model.path`` and data
files against the profile file, so they resolve the same), modes, steps and shape, its runs under
this bench's output directory. Only flags every version since ``bench step`` landed knows are
sent; the seed travels in a profile that ``extends`` the original and sets ``run.seed`` (the
seed-0 run gets the original file). Its runs' metrics.jsonl are then read by this version's
:func:`~rlctl.bench.step_common.summarise_metrics`, so both sides are measured by one arithmetic.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from rlctl.bench.step_common import StepBenchConfig, host_matmul_gflops, shipped_profile, summarise_metrics
from rlctl.errors import RunError, UserError


def check_baseline(path: str) -> Path:
    """The checkout ``--baseline`` names, or a UserError when it holds no ``rlctl/`` package."""
    root = Path(path).expanduser().resolve()
    if not (root / "rlctl" / "__init__.py").is_file():
        raise UserError(
            f"--baseline {path}: expected a checkout of rlctl (a directory holding rlctl/__init__.py)"
        )
    return root


def profile_path(cfg: StepBenchConfig) -> Path:
    return Path(cfg.profile or shipped_profile()).expanduser().resolve()


def seed_profile(cfg: StepBenchConfig, seed_index: int, base_seed: int, out: Path) -> Path:
    """The profile the baseline runs for seed ``base_seed + seed_index``."""
    path = profile_path(cfg)
    if not seed_index:
        return path
    child = out / f"seed{base_seed + seed_index}.toml"
    child.write_text(f"extends = {json.dumps(str(path))}\n\n[run]\nseed = {base_seed + seed_index}\n")
    return child


def baseline_args(cfg: StepBenchConfig, profile: Path, out: Path) -> list[str]:
    """The ``bench step`` flags of the baseline run: the ones its version (since 337d994) knows."""
    args = [
        "--profile", str(profile),
        "--steps", str(cfg.steps),
        "--val-every", str(cfg.val_every),
        "--modes", ",".join(cfg.modes),
        "--max-staleness", str(cfg.max_staleness),
        "--out", str(out),
        "--json",
    ]  # fmt: skip
    for flag, value in (
        ("--prompts", cfg.prompts_per_step),
        ("-n", cfg.n),
        ("--lr", cfg.lr),
        ("--val-size", cfg.val_size),
        ("--backend", cfg.backend),
    ):
        if value is not None:
            args += [flag, str(value)]
    return args


def run_baseline(
    cfg: StepBenchConfig, out: Path, base_seed: int, *, sequences: int, params: int
) -> dict[str, list[dict[str, Any]]]:
    """Per mode, the baseline's per-seed summaries (seed order), measured by this version (the
    host's GEMM rate measured right before each seed's subprocess)."""
    root = check_baseline(cfg.baseline)
    if cfg.overrides:
        raise UserError(
            "--baseline: profile overrides cannot be passed to another version; put them in the profile"
        )
    out = out / "baseline"
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(root)}
    imported = subprocess.run(
        [sys.executable, "-c", "import rlctl; print(rlctl.__file__)"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
    ).stdout.strip()
    if not imported or Path(imported).resolve() != root / "rlctl" / "__init__.py":
        raise RunError(
            f"baseline {root}: its python imports rlctl from {imported or 'nowhere'}, not from the checkout"
        )
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in cfg.modes}
    for i in range(cfg.seeds):
        seed = base_seed + i
        run_out = out / f"seed{seed}"
        args = baseline_args(cfg, seed_profile(cfg, i, base_seed, out), run_out)
        log = out / f"seed{seed}.log"
        peak = host_matmul_gflops()
        with log.open("w") as err:
            proc = subprocess.run(
                [sys.executable, "-m", "rlctl.cli.main", "bench", "step", *args],
                cwd=root,
                env=env,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
            )
        if proc.returncode != 0:
            raise RunError(
                f"baseline {root} (seed {seed}) exited with code {proc.returncode}; its stderr: {log}"
            )
        (out / f"seed{seed}.json").write_text(proc.stdout)
        for mode in cfg.modes:
            found = sorted(run_out.glob(f"rlctl-{mode}*/metrics.jsonl"))
            if len(found) != 1:
                raise RunError(
                    f"baseline {root} (seed {seed}): expected one {run_out}/rlctl-{mode}*/metrics.jsonl"
                )
            runs[mode].append(
                summarise_metrics(
                    f"baseline-{mode}",
                    found[0],
                    sequences=sequences,
                    params=params,
                    peak_gflops=peak,
                    target=cfg.target,
                )
            )
    return runs
