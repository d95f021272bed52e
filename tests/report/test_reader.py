"""metrics.jsonl reading: merged steps, and one-line UserErrors naming file:line."""

from __future__ import annotations

import pytest

from rlctl.errors import UserError
from rlctl.report import load_metrics


def _write(tmp_path, text):
    (tmp_path / "metrics.jsonl").write_text(text)
    return tmp_path


def test_same_step_lines_merge_and_records_sort_by_step(tmp_path):
    _write(
        tmp_path,
        '{"step": 2, "x": 1.0}\n\n{"step": 0, "val/accuracy": 0.5}\n{"step": 2, "val/accuracy": 0.75, "y": null}\n',
    )
    assert load_metrics(tmp_path) == [
        {"step": 0, "val/accuracy": 0.5},
        {"step": 2, "x": 1.0, "val/accuracy": 0.75, "y": None},
    ]


@pytest.mark.parametrize(
    ("text", "where", "what"),
    [
        ('{"step": 1}\n{"step": 2, "x": \n', ":2:", "not valid JSON"),
        ('{"step": 1}\n\n[1, 2]\n', ":3:", "JSON object"),
        ('{"x": 1.0}\n', ":1:", "'step'"),
        ('{"step": "3"}\n', ":1:", "'step'"),
        ('{"step": 1}\n{"step": 2, "reward/score_mean": "high"}\n', ":2:", "'reward/score_mean'"),
        ('{"step": 1}\n' + "[" * 100_000 + "]" * 100_000 + "\n", ":2:", "nested too deeply"),
    ],
)
def test_malformed_lines_name_file_and_line(tmp_path, text, where, what):
    _write(tmp_path, text)
    with pytest.raises(UserError) as err:
        load_metrics(tmp_path)
    msg = str(err.value)
    assert f"metrics.jsonl{where}" in msg and what in msg and "\n" not in msg


def test_non_utf8_metrics_name_line_and_byte_offset(tmp_path):
    (tmp_path / "metrics.jsonl").write_bytes(b'{"step": 1}\n{"step": 2, "\xff": 1}\n')
    with pytest.raises(UserError) as err:
        load_metrics(tmp_path)
    assert (
        str(err.value)
        == f"{tmp_path / 'metrics.jsonl'}:2: not UTF-8 (byte 0xff at byte offset 25 of the file)"
    )


def test_missing_empty_and_not_a_directory(tmp_path):
    with pytest.raises(UserError, match="metrics.jsonl: not found"):
        load_metrics(tmp_path)
    _write(tmp_path, "\n\n")
    with pytest.raises(UserError, match="metrics.jsonl: empty"):
        load_metrics(tmp_path)
    with pytest.raises(UserError, match="not a directory"):
        load_metrics(tmp_path / "nope")
