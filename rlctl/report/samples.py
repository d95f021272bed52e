"""The samples section of ``report.md``: what the model wrote, from ``RUN_DIR/samples.jsonl``.

Tables show the latest validation samples, the first validation's (for a before/after look) and
the latest training samples. A group is the rows one write produced (same step, phase and
``start_step``, consecutive in the file); "latest" is the group written last, so after a resume
it is the resumed run's own, never rows of the interrupted attempt it replaced.
Text is escaped so that any prompt or response renders as itself inside a markdown table cell.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SAMPLES_FILE = "samples.jsonl"
PROMPT_CHARS = 300
RESPONSE_CHARS = 300
TRUTH_CHARS = 60
MAX_ROWS = 8  # per table

# Characters CommonMark/GFM (and GitHub's $math$) read as markup inside a table cell: each is
# backslash-escaped. ``<`` and ``&`` only where they could open a tag/autolink or an entity, so
# special tokens such as <|im_end|> stay readable in the raw file as <\|im_end\|>.
_BACKSLASHED = set("\\`*_[]~$|")
_TAG_START = re.compile(r"<[A-Za-z/!?]")
_ENTITY_START = re.compile(r"&[A-Za-z#]")


@dataclass
class SampleGroup:
    """The rows of one write: one step's validation or training samples."""

    step: int
    phase: str
    rows: list[dict[str, Any]] = field(default_factory=list)


def clip(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, keeping its head and tail around an ellipsis (the
    template header and the question of a prompt; the start and final answer of a response)."""
    if len(text) <= limit:
        return text
    head = (limit - 1) // 2
    return text[:head] + "…" + text[len(text) - (limit - 1 - head) :]


def md_cell(text: str, limit: int | None = None) -> str:
    """``text`` (clipped to ``limit`` characters) as a GFM table cell that renders as that text:
    markup characters escaped, newlines as ``<br>``, other control characters as ``\\xNN``."""
    if limit is not None:
        text = clip(text, limit)
    text = text.replace("\r\n", "\n")
    out = []
    for i, ch in enumerate(text):
        if ch == "_" and 0 < i < len(text) - 1 and text[i - 1].isalnum() and text[i + 1].isalnum():
            out.append(ch)  # intraword: never emphasis (CommonMark's flanking rules), so im_end stays
        elif ch in _BACKSLASHED or (
            ch in "<&" and (_TAG_START if ch == "<" else _ENTITY_START).match(text, i) is not None
        ):
            out.append("\\" + ch)
        elif ch in "\n\r":
            out.append("<br>")
        elif (ord(ch) < 32 and ch != "\t") or ord(ch) == 127:
            out.append(f"\\\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return "".join(out)


def load_samples(run_dir: str | Path) -> tuple[list[dict[str, Any]], int]:
    """The rows of ``RUN_DIR/samples.jsonl`` in file order, and how many lines were unreadable
    (a half-written last line of a killed run); no file: no rows."""
    path = Path(run_dir) / SAMPLES_FILE
    if not path.is_file():
        return [], 0
    rows, bad = [], 0
    with path.open(encoding="utf-8", errors="replace") as fh:
        for line in fh:
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                bad += 1
                continue
            if isinstance(row, dict) and isinstance(row.get("step"), int) and row.get("phase"):
                rows.append(row)
            else:
                bad += 1
    return rows, bad


def groups(rows: list[dict[str, Any]]) -> list[SampleGroup]:
    """Consecutive rows of one write (same step, phase and start_step) as groups, in file order."""
    out: list[SampleGroup] = []
    key = None
    for row in rows:
        k = (row["step"], row["phase"], row.get("start_step"))
        if k != key:
            out.append(SampleGroup(row["step"], row["phase"]))
            key = k
        out[-1].rows.append(row)
    return out


def chosen_groups(rows: list[dict[str, Any]]) -> list[tuple[str, SampleGroup]]:
    """(title, group) of each table: latest validation, first validation, latest training."""
    found = groups(rows)
    val = [g for g in found if g.phase == "val"]
    train = [g for g in found if g.phase == "train"]
    out = []
    if val:
        out.append((f"Validation, step {val[-1].step} (latest)", val[-1]))
        if len(val) > 1 and val[0].step != val[-1].step:
            out.append((f"Validation, step {val[0].step} (first)", val[0]))
    if train:
        out.append((f"Training, step {train[-1].step} (latest)", train[-1]))
    return out


def _number(value: Any) -> str:
    if value is None:
        return "n/a"
    return f"{value:g}" if isinstance(value, (int, float)) else md_cell(str(value))


def sample_table(group: SampleGroup) -> str:
    """One markdown table of a group's rows (at most ``MAX_ROWS``)."""
    rows = group.rows[:MAX_ROWS]
    with_acc = any(r.get("acc") is not None for r in rows)
    header = ["prompt", "response", "ground truth", "score", *(["acc"] if with_acc else []), "tokens"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        truth = r.get("ground_truth")
        cells = [
            md_cell(str(r.get("prompt", "")), PROMPT_CHARS),
            md_cell(str(r.get("response", "")), RESPONSE_CHARS),
            md_cell(truth if isinstance(truth, str) else json.dumps(truth, ensure_ascii=False), TRUTH_CHARS),
            _number(r.get("score")),
            *([_number(r.get("acc"))] if with_acc else []),
            _number(r.get("response_length")),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def samples_markdown(run_dir: str | Path) -> tuple[str, int]:
    """The report's samples section and the number of rows it shows."""
    rows, bad = load_samples(run_dir)
    if not rows:
        note = f" ({bad} unreadable lines in {SAMPLES_FILE})" if bad else ""
        return (
            "## Samples\n\nNo samples recorded (trainer.log_samples = 0, or the run wrote none yet)"
            f"{note}.\n",
            0,
        )
    parts = ["## Samples\n"]
    shown = 0
    for title, group in chosen_groups(rows):
        versions = {r.get("weight_version") for r in group.rows} - {None}
        where = f", weights v{min(versions)}" if len(versions) == 1 else ""
        parts.append(f"### {title}{where}\n\n{sample_table(group)}\n")
        shown += min(len(group.rows), MAX_ROWS)
    parts.append(
        f"Texts as the model saw and wrote them (special tokens kept), cut to {PROMPT_CHARS} "
        f"characters with …; every row: {SAMPLES_FILE}"
        + (f" ({bad} unreadable lines skipped)" if bad else "")
        + ".\n"
    )
    return "\n".join(parts), shown
