"""Progress for people: a rich progress bar on a terminal, compact log lines elsewhere.

The bar shows step/total, reward, validation accuracy, seconds per step and time left. Off a
terminal (CI, ``nohup``, Ray job logs) a bar would spam the log, so every ``every`` steps, on the
last step and on each validation, one structured line goes through ``rlctl.log.get_logger``.
Everything goes to stderr so stdout stays free for machine output.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from rlctl.log import get_logger

REWARD_KEY = "reward/score_mean"
ACC_KEY = "reward/accuracy"
VAL_KEY = "val/accuracy"
STEP_TIME_KEY = "time/step"
TOKENS_KEY = "perf/tokens_per_s"


def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


# What one validation sample shows on the console (characters): the prompt's end (the question and
# the template's assistant header), the response's start and end (with its end token).
SAMPLE_PROMPT_CHARS = 60
SAMPLE_RESPONSE_CHARS = 120
SAMPLE_TRUTH_CHARS = 40
FIRST_PROMPT_CHARS = 4000


def clip(text: str, limit: int, keep: str = "middle") -> str:
    """``text`` cut to ``limit`` characters with an ellipsis: ``keep`` is the part kept (middle:
    head and tail, tail: the end)."""
    if len(text) <= limit:
        return text
    if keep == "tail":
        return "…" + text[len(text) - limit + 1 :]
    head = (limit - 1) // 2
    return text[:head] + "…" + text[len(text) - (limit - 1 - head) :]


def show_sample(row: dict[str, Any]) -> None:
    """One line for one sample row of ``samples.jsonl`` (see ``rlctl.trainer.state.samples``).

    Values are printed as Python string literals, so newlines and trailing spaces stay visible.
    """
    fields: dict[str, Any] = {"step": row.get("step"), "score": _fmt(row.get("score"))}
    if row.get("acc") is not None:
        fields["acc"] = _fmt(row["acc"])
    fields["ground_truth"] = clip(str(row.get("ground_truth")), SAMPLE_TRUTH_CHARS)
    fields["prompt"] = clip(str(row.get("prompt", "")), SAMPLE_PROMPT_CHARS, keep="tail")
    fields["response"] = clip(str(row.get("response", "")), SAMPLE_RESPONSE_CHARS)
    get_logger("rlctl.train").info(f"{row.get('phase', 'val')} sample", **fields)


def show_first_prompt(text: str, tokens: int) -> None:
    """The first prompt of the run as the model sees it, once at start: a wrong chat template
    (missing system prompt, doubled BOS, no assistant header) shows here before any training."""
    get_logger("rlctl.train").info(
        "first prompt, as rendered for the model", tokens=tokens, text=clip(text, FIRST_PROMPT_CHARS)
    )


class ConsoleBackend:
    """Shows training progress; ``mode`` is ``auto`` (bar when stderr is a terminal), ``bar`` or ``lines``."""

    def __init__(
        self,
        total_steps: int,
        run_name: str = "",
        every: int = 10,
        mode: str = "auto",
        console: Any = None,
        start_step: int = 0,
    ) -> None:
        if mode not in ("auto", "bar", "lines"):
            raise ValueError(f"console mode must be auto, bar or lines, got {mode!r}")
        if mode == "auto":
            is_tty = console.is_terminal if console is not None else sys.stderr.isatty()
            mode = "bar" if is_tty else "lines"
        self.mode = mode
        self.total = int(total_steps)
        self.every = max(1, int(every))
        self.run_name = run_name
        self._reward: float | None = None
        self._acc: float | None = None
        self._val: float | None = None
        self._s_per_step: float | None = None
        self._tokens_s: float | None = None
        self._last_step: int | None = None
        self._last_wall: float | None = None
        self._printed_step: int | None = None
        self._log = get_logger("rlctl.train", run=run_name) if run_name else get_logger("rlctl.train")
        self._progress = None
        if self.mode == "bar":
            self._start_bar(console, start_step)

    def _start_bar(self, console: Any, start_step: int) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
        )

        # fits 80 columns: name, bar, step/total, reward, val accuracy, s/step, time left
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(bar_width=12),
            MofNCompleteColumn(),
            TextColumn("reward {task.fields[reward]} val {task.fields[val]} {task.fields[sps]} s/step"),
            TimeRemainingColumn(),
            console=console if console is not None else Console(stderr=True),
            transient=False,
        )
        self._task = self._progress.add_task(
            self.run_name or "train",
            total=self.total,
            completed=start_step,
            reward="-",
            val="-",
            sps="-",
        )
        self._progress.start()

    def _update_state(self, metrics: dict[str, float], step: int) -> None:
        if metrics.get(REWARD_KEY) is not None:
            self._reward = float(metrics[REWARD_KEY])
        if metrics.get(ACC_KEY) is not None:
            self._acc = float(metrics[ACC_KEY])
        if metrics.get(VAL_KEY) is not None:
            self._val = float(metrics[VAL_KEY])
        if metrics.get(TOKENS_KEY) is not None:
            self._tokens_s = float(metrics[TOKENS_KEY])
        now = time.perf_counter()
        if metrics.get(STEP_TIME_KEY) is not None:
            self._s_per_step = float(metrics[STEP_TIME_KEY])
        elif self._last_step is not None and step > self._last_step and self._last_wall is not None:
            self._s_per_step = (now - self._last_wall) / (step - self._last_step)
        if self._last_step is None or step != self._last_step:
            self._last_step, self._last_wall = step, now

    def log(self, metrics: dict[str, float], step: int) -> None:
        self._update_state(metrics, step)
        if self._progress is not None:
            self._progress.update(
                self._task,
                completed=min(step, self.total) if self.total else step,
                reward=_fmt(self._reward),
                val=_fmt(self._val),
                sps=_fmt(self._s_per_step),
            )
            return
        is_val = metrics.get(VAL_KEY) is not None
        if is_val and step == self._printed_step:  # validation logged after this step's line
            self._log.info("validation", step=f"{step}/{self.total}", val_acc=_fmt(self._val))
        elif is_val or step % self.every == 0 or step == self.total:
            self._printed_step = step
            fields: dict[str, Any] = {"step": f"{step}/{self.total}"}
            for name, value, digits in (
                ("reward", self._reward, 3),
                ("acc", self._acc, 3),
                ("val_acc", self._val, 3),
                ("s_per_step", self._s_per_step, 3),
                ("tokens_per_s", self._tokens_s, 0),
            ):
                if value is not None:
                    fields[name] = _fmt(value, digits)
            self._log.info("progress", **fields)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
