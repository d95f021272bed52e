"""Samples a person can read: decoded prompt/response rows in ``RUN_DIR/samples.jsonl``.

At each validation and every ``trainer.log_samples_every`` training steps (and the last one),
``trainer.log_samples`` rows of the batch are decoded with the run's tokenizer and appended as
one JSON object each::

    {"step", "phase" (train | val), "prompt", "response", "score", "ground_truth", "acc",
     "response_length", "weight_version", "uid", "start_step"}

Text is decoded with special tokens kept: the prompt as the chat template rendered it, the
response as the model wrote it, up to and including its end token (a multi-turn episode with the
environment's observations in place; ``response_length`` counts the model's tokens). ``acc`` and
``weight_version`` are present when the scorer / rollout engine report them; ``start_step`` is
the step this training process started from (0 fresh, the checkpoint's step after a resume).

Which rows (deterministic given the seed, since the batch is): validation takes the first N
prompts; training takes the first response of each prompt in batch order, then the second ones,
and so on, so N rows show N different prompts when the batch has that many.

The file is append-only. A resumed run continues it; rows that an interrupted run wrote after
its last checkpoint stay (they are what that run generated; their ``start_step`` tells them
apart). A run that starts fresh in a directory that already has a ``samples.jsonl`` moves it
aside to ``samples.prev-<timestamp>.jsonl``, as the checkpoints and metrics are, never deleting it.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

from rlctl.dispatch import DataProto
from rlctl.log import get_logger
from rlctl.tracking.console import show_first_prompt, show_sample
from rlctl.tracking.run_files import open_nofollow

SAMPLES_FILE = "samples.jsonl"

log = get_logger("rlctl.samples")


def pick_rows(size: int, group: int, count: int) -> list[int]:
    """``count`` row indices of a batch of ``size`` rows whose consecutive ``group`` rows share a
    prompt: the first row of every group (in order), then the second of every group, ..."""
    group = max(1, group)
    return sorted(range(size), key=lambda i: (i % group, i // group))[: max(0, count)]


def prompt_ids(batch: DataProto, row: int) -> list[int]:
    """Row ``row``'s prompt token ids, padding dropped (``input_ids`` is prompt then response, or
    the prompt alone in a batch of prompts)."""
    t = batch.batch
    width = t["input_ids"].shape[1] - (t["responses"].shape[1] if "responses" in t else 0)
    return t["input_ids"][row, :width][t["attention_mask"][row, :width].bool()].tolist()


def decode_prompt(batch: DataProto, tokenizer: Any, row: int) -> str:
    """Row ``row``'s prompt as the model saw it (special tokens kept)."""
    return tokenizer.decode(prompt_ids(batch, row), skip_special_tokens=False)


def decode_response(batch: DataProto, tokenizer: Any, row: int) -> str:
    """Row ``row``'s response up to and including its end token, special tokens kept.

    Every attended response token is decoded, so a multi-turn episode shows the environment's
    observations between the model's turns (``response_mask`` covers the model's tokens only).
    """
    t = batch.batch
    width = t["responses"].shape[1]
    ids = t["responses"][row][t["attention_mask"][row, -width:].bool()]
    return tokenizer.decode(ids.tolist(), skip_special_tokens=False)


def _number(value: Any) -> float | None:
    number = float(value)
    return number if math.isfinite(number) else None


def _jsonable(value: Any) -> Any:
    """``value`` as JSON can hold it: numpy scalars and arrays become Python values, else its str."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return str(value)
    return value


def sample_rows(
    batch: DataProto, tokenizer: Any, rows: list[int], *, step: int, phase: str, start_step: int = 0
) -> list[dict[str, Any]]:
    """The ``samples.jsonl`` records of ``rows`` of a scored batch."""
    t, nt = batch.batch, batch.non_tensor
    version = batch.meta.get("weight_version")
    out = []
    for i in rows:
        record: dict[str, Any] = {
            "step": int(step),
            "phase": phase,
            "prompt": decode_prompt(batch, tokenizer, i),
            "response": decode_response(batch, tokenizer, i),
            "score": _number(t["scores"][i]),
            "ground_truth": _jsonable(nt["ground_truth"][i]) if "ground_truth" in nt else None,
        }
        if "acc" in t:
            record["acc"] = _number(t["acc"][i])
        record["response_length"] = int(t["response_mask"][i].sum())
        if version is not None:
            record["weight_version"] = int(version)
        if "uid" in nt:
            record["uid"] = str(nt["uid"][i])
        record["start_step"] = int(start_step)
        out.append(record)
    return out


def move_aside(path: Path) -> Path | None:
    """Rename an existing ``path`` to ``<stem>.prev-<timestamp><suffix>`` (a free name); None if absent."""
    if not path.exists():
        return None
    base = time.strftime("%Y%m%d-%H%M%S")
    for n in range(1000):
        target = path.with_name(f"{path.stem}.prev-{base}{'' if n == 0 else f'-{n}'}{path.suffix}")
        if not target.exists():
            os.replace(path, target)
            log.warning("the previous samples were moved aside", path=str(target))
            return target
    return None  # 1000 files of this second: keep appending rather than fail a run over a log


class SampleLog:
    """Writes a run's sample rows; ``count`` 0 writes none (the first prompt is still logged once)."""

    def __init__(
        self,
        run_dir: Path | None,
        tokenizer: Any,
        *,
        count: int,
        every: int,
        group: int,
        total_steps: int,
        start_step: int | None,
    ) -> None:
        self.path = Path(run_dir) / SAMPLES_FILE if run_dir is not None else None
        self.tokenizer = tokenizer
        self.count = count if self.path is not None else 0
        self.every = every
        self.group = group
        self.total_steps = total_steps
        self.start_step = start_step or 0
        self._prompt_shown = tokenizer is None
        if self.path is not None and self.count and start_step is None:
            move_aside(self.path)  # a fresh start: an earlier run's rows are not this run's

    @classmethod
    def off(cls) -> SampleLog:
        """Writes and shows nothing (a Trainer before ``fit`` opened the run's log)."""
        return cls(None, None, count=0, every=0, group=1, total_steps=0, start_step=0)

    @classmethod
    def for_run(cls, ctx: Any, total_steps: int, resumed_step: int | None) -> SampleLog:
        """The log of ``ctx``'s run directory; ``resumed_step`` None means a fresh start.

        Shows the first validation prompt now, before anything is generated (without validation
        prompts: the first training prompt, at the first step)."""
        p = ctx.profile
        samples = cls(
            ctx.run_dir,
            ctx.tokenizer,
            count=p.trainer.log_samples,
            every=p.trainer.log_samples_every,
            group=p.rollout.n,
            total_steps=total_steps,
            start_step=resumed_step,
        )
        if ctx.val_prompts is not None:
            samples._first_prompt(ctx.val_prompts)
        return samples

    def training(self, batch: DataProto, step: int) -> None:
        """After a step's rollout and reward: rows every ``every`` steps and at the last step."""
        self._first_prompt(batch)
        if step == self.total_steps or (self.every > 0 and step % self.every == 0):
            self._write(batch, pick_rows(len(batch), self.group, self.count), step, "train")

    def validation(self, batch: DataProto, step: int) -> None:
        """After a validation: its first rows, and the first of them on the console."""
        self._first_prompt(batch)
        rows = self._write(batch, list(range(min(self.count, len(batch)))), step, "val")
        if rows:
            show_sample(rows[0])

    def _first_prompt(self, batch: DataProto) -> None:
        if self._prompt_shown or not len(batch):
            return
        self._prompt_shown = True
        ids = prompt_ids(batch, 0)
        show_first_prompt(self.tokenizer.decode(ids, skip_special_tokens=False), len(ids))

    def _write(self, batch: DataProto, rows: list[int], step: int, phase: str) -> list[dict[str, Any]]:
        if not self.count or not rows:
            return []
        records = sample_rows(batch, self.tokenizer, rows, step=step, phase=phase, start_step=self.start_step)
        # backslashreplace: a lone surrogate still becomes a valid JSON escape instead of failing the step
        with open_nofollow(self.path, "a", errors="backslashreplace") as fh:
            fh.writelines(json.dumps(r, ensure_ascii=False, allow_nan=False) + "\n" for r in records)
        return records
