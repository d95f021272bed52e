"""``metrics.jsonl``: one JSON object per line, ``step`` first, flushed as it is written.

This file is the run's metric record: ``rlctl report`` reads it and resumed runs append to it.
On resume the lines of steps after the resumed step are dropped (they belong to the part of the
interrupted run that the checkpoint does not cover and will be recomputed), so the file never
holds two records of the same step from different trajectories.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import IO

from rlctl.log import get_logger
from rlctl.tracking.base import to_number
from rlctl.tracking.run_files import open_nofollow

FILENAME = "metrics.jsonl"


def _line_step(line: str) -> int | None:
    """The ``step`` of one line, or None when the line is not a complete record."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return None
    step = record.get("step") if isinstance(record, dict) else None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def truncate_after(path: Path, last_step: int) -> int:
    """Keep only lines whose step is <= ``last_step``; returns how many lines were dropped.

    Unparsable lines (e.g. a half-written last line of a killed run) are dropped too. The file is
    rewritten through a temp file and an atomic rename so a crash here cannot lose the history.
    """
    if not path.exists():
        return 0
    kept: list[str] = []
    dropped = 0
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            if not line.strip():
                continue
            step = _line_step(line)
            if step is not None and step <= last_step:
                kept.append(line if line.endswith("\n") else line + "\n")
            else:
                dropped += 1
    if dropped:
        tmp = path.with_name(path.name + ".tmp")
        with tmp.open("w", encoding="utf-8") as fh:
            fh.writelines(kept)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    return dropped


class JsonlBackend:
    """Appends ``{"step": s, **metrics}`` lines to ``RUN_DIR/metrics.jsonl``.

    ``resume=False`` starts a fresh file. ``resume=True`` keeps the history: with ``resume_step``
    known, lines after it are dropped now; otherwise they are dropped at the first ``log`` call
    (every line with a step >= the first step logged after the resume).
    """

    def __init__(self, run_dir: Path, resume: bool, resume_step: int | None = None) -> None:
        self.path = Path(run_dir) / FILENAME
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._pending_resume = False
        if resume:
            if resume_step is not None:
                self._drop_after(resume_step)
            else:
                self._pending_resume = True
            mode = "a"
        else:
            mode = "w"
        self._fh: IO[str] | None = open_nofollow(self.path, mode)

    def _drop_after(self, last_step: int) -> None:
        dropped = truncate_after(self.path, last_step)
        if dropped:
            get_logger("rlctl.tracking").info(
                "metrics.jsonl: dropped records after the resumed step",
                path=str(self.path),
                resumed_step=last_step,
                dropped=dropped,
            )

    def log(self, metrics: dict[str, float], step: int) -> None:
        if self._fh is None:
            raise RuntimeError(f"{self.path}: log() after close()")
        if self._pending_resume:
            self._pending_resume = False
            self._fh.close()
            self._drop_after(step - 1)
            self._fh = open_nofollow(self.path, "a")
        record: dict[str, float | int | None] = {"step": int(step)}
        for key, value in metrics.items():
            if key != "step":
                record[key] = to_number(key, value)
        self._fh.write(json.dumps(record, allow_nan=False) + "\n")
        self._fh.flush()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
