"""Read ``RUN_DIR/metrics.jsonl`` into per-step records, with one-line errors naming file:line.

Several lines may carry the same step (e.g. training metrics, then the validation of that step);
they are merged into one record. A later value for the same key wins.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rlctl.errors import UserError

METRICS_FILE = "metrics.jsonl"

Record = dict[str, Any]


def _check_line(path: Path, lineno: int, raw: str) -> Record:
    where = f"{path}:{lineno}"
    try:
        record = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise UserError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from None
    except RecursionError:
        raise UserError(f"{where}: JSON nested too deeply to parse (expected flat metric records)") from None
    if not isinstance(record, dict):
        raise UserError(f"{where}: expected a JSON object per line, got {type(record).__name__}")
    step = record.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise UserError(f"{where}: expected a non-negative integer 'step', got {step!r}")
    for key, value in record.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise UserError(f"{where}: key {key!r}: expected a number or null, got {value!r}")
    return record


def load_metrics(run_dir: str | Path) -> list[Record]:
    """All records of a run, one per step, sorted by step. Raises ``UserError`` on bad input."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UserError(f"{run_dir}: not a directory (expected a run directory written by 'rlctl train')")
    path = run_dir / METRICS_FILE
    if not path.is_file():
        raise UserError(f"{path}: not found (expected a run directory written by 'rlctl train')")
    by_step: dict[int, Record] = {}
    offset = 0
    with path.open("rb") as fh:
        for lineno, data in enumerate(fh, start=1):
            start, offset = offset, offset + len(data)
            try:
                raw = data.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise UserError(
                    f"{path}:{lineno}: not UTF-8 (byte 0x{data[exc.start : exc.start + 1].hex()} at byte "
                    f"offset {start + exc.start} of the file)"
                ) from None
            if not raw.strip():
                continue
            record = _check_line(path, lineno, raw)
            by_step.setdefault(record["step"], {}).update(record)
    if not by_step:
        raise UserError(f"{path}: empty (no step was recorded yet)")
    return [by_step[step] for step in sorted(by_step)]
