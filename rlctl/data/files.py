"""Read verl-schema rows from JSONL and Parquet files, validating each row on the way."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rlctl.data.schema import validate_row
from rlctl.errors import UserError

JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
PARQUET_SUFFIXES = (".parquet", ".pq")


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a JSON-lines file (blank lines skipped); errors name the file, row and line.

    Bytes that are not UTF-8 name the line and the byte offset in the file; JSON nested too
    deep for the parser (a RecursionError) is one line as well.
    """
    p = Path(path)
    rows: list[dict[str, Any]] = []
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise UserError(f"{p}: cannot read data file: {exc.strerror or exc}") from None
    offset = 0
    for line_no, raw in enumerate(data.split(b"\n"), start=1):
        start, offset = offset, offset + len(raw) + 1
        where = f"{p}: row {len(rows) + 1} (line {line_no})"
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            bad = raw[exc.start : exc.start + 1].hex()
            raise UserError(
                f"{where}: not UTF-8 (byte 0x{bad} at byte offset {start + exc.start} of the file, "
                f"column {exc.start + 1} of the line); expected a UTF-8 JSON-lines file"
            ) from None
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UserError(
                f"{p}:{line_no}: row {len(rows) + 1}: not valid JSON: {exc.msg} at column {exc.colno}"
            ) from None
        except RecursionError:
            raise UserError(
                f"{p}:{line_no}: row {len(rows) + 1}: JSON nested too deeply to parse; expected plain fields"
            ) from None
        rows.append(validate_row(obj, where))
    return rows


def read_parquet(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a Parquet file (nested columns become dicts/lists); errors name the file and row."""
    import pyarrow.parquet as pq

    p = Path(path)
    try:
        table = pq.read_table(p)
    except (OSError, ValueError) as exc:  # pyarrow raises ArrowInvalid (a ValueError) on bad files
        raise UserError(f"{p}: cannot read Parquet file: {exc}") from None
    return [validate_row(obj, f"{p}: row {i}") for i, obj in enumerate(table.to_pylist(), start=1)]


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a data file, by suffix: .jsonl/.json/.ndjson or .parquet/.pq."""
    p = Path(path)
    if not p.exists():
        raise UserError(f"{p}: data file not found")
    suffix = p.suffix.lower()
    if suffix in JSONL_SUFFIXES:
        return read_jsonl(p)
    if suffix in PARQUET_SUFFIXES:
        return read_parquet(p)
    raise UserError(f"{p}: unknown data file type {suffix!r}; expected .jsonl or .parquet")


def write_jsonl(rows: list[dict[str, Any]], path: str | Path) -> Path:
    """Write rows as JSON lines (used to export built-in tasks and in tests)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with p.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return p


def write_parquet(rows: list[dict[str, Any]], path: str | Path) -> Path:
    """Write rows as a Parquet file (nested columns as structs/lists)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), p)
    return p
