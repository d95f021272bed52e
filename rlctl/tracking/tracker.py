"""``Tracker``: the driver's single call for metrics, fanned out to the backends a profile names."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlctl.errors import UserError
from rlctl.log import get_logger
from rlctl.tracking.base import Backend
from rlctl.tracking.console import ConsoleBackend
from rlctl.tracking.jsonl import JsonlBackend
from rlctl.tracking.optional import TensorBoardBackend, WandbBackend, warn_missing

VALID_LOGGERS: tuple[str, ...] = ("console", "jsonl", "tensorboard", "wandb")


class Tracker:
    """Sends ``log(metrics, step)`` to every backend in ``loggers``.

    ``loggers`` is the profile's list, e.g. ``["console", "jsonl"]``; an unknown name is a
    ``UserError`` naming ``source`` (pass e.g. ``"profiles/x.toml: trainer.loggers"``); ``tensorboard``/``wandb`` that are not installed warn once and are skipped.
    ``resume=True`` continues the run directory's history; pass ``resume_step`` (the checkpoint's
    step) when known so records after it are dropped at once, otherwise they are dropped at the
    first ``log`` call. A backend that fails while logging is warned about and dropped, never
    stopping the run.
    """

    def __init__(
        self,
        run_dir: str | Path,
        loggers: list[str],
        run_name: str,
        config: dict[str, Any],
        total_steps: int,
        resume: bool,
        *,
        resume_step: int | None = None,
        console_every: int = 10,
        console_mode: str = "auto",
        console: Any = None,
        source: str = "trainer.loggers",
    ) -> None:
        unknown = [name for name in loggers if name not in VALID_LOGGERS]
        if unknown:
            raise UserError(
                f"{source}: unknown logger {unknown[0]!r}; expected any of {', '.join(VALID_LOGGERS)}"
            )
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.backends: dict[str, Backend] = {}
        for name in dict.fromkeys(loggers):  # keep order, drop repeats
            if name == "jsonl":
                self.backends[name] = JsonlBackend(self.run_dir, resume=resume, resume_step=resume_step)
            elif name == "console":
                self.backends[name] = ConsoleBackend(
                    total_steps,
                    run_name=run_name,
                    every=console_every,
                    mode=console_mode,
                    console=console,
                    start_step=resume_step or 0,
                )
            else:
                try:
                    if name == "tensorboard":
                        self.backends[name] = TensorBoardBackend(self.run_dir, resume_step=resume_step)
                    else:
                        self.backends[name] = WandbBackend(self.run_dir, run_name, config, resume=resume)
                except ImportError as exc:
                    warn_missing(name, exc)

    def log(self, metrics: dict[str, float], step: int) -> None:
        """Record ``metrics`` for ``step`` in every backend (several calls per step are allowed)."""
        for name, backend in list(self.backends.items()):
            if name == "jsonl":  # the run's record: its failures (disk full, bad value) must surface
                backend.log(metrics, step)
                continue
            try:
                backend.log(metrics, step)
            except Exception as exc:  # a dashboard failing must not stop training
                get_logger("rlctl.tracking").warning(
                    f"logger '{name}' failed; disabled for the rest of the run", error=repr(exc), step=step
                )
                self.backends.pop(name)

    def close(self) -> None:
        """Flush and close every backend (safe to call twice)."""
        backends, self.backends = self.backends, {}
        for name, backend in backends.items():
            try:
                backend.close()
            except Exception as exc:
                get_logger("rlctl.tracking").warning(f"logger '{name}' failed to close", error=repr(exc))

    def __enter__(self) -> Tracker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
