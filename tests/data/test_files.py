"""JSONL and Parquet loading in verl's schema; malformed rows name the file, row and field."""

from __future__ import annotations

import json

import pytest

from rlctl.data import load_dataset, read_rows, write_jsonl, write_parquet
from rlctl.errors import UserError


def _row(i=0, **over):
    row = {
        "prompt": [{"role": "user", "content": f"q{i}"}],
        "data_source": "mytask",
        "reward_model": {"ground_truth": f"a{i}", "style": "rule"},
        "extra_info": {"index": i},
    }
    row.update(over)
    return row


@pytest.mark.parametrize("writer", [write_jsonl, write_parquet])
def test_round_trip(tmp_path, writer):
    rows = [_row(i) for i in range(5)]
    path = writer(rows, tmp_path / ("d.jsonl" if writer is write_jsonl else "d.parquet"))
    assert read_rows(path) == rows


def test_parquet_with_dict_ground_truth_and_builtin_export(tmp_path):
    rows = load_dataset("builtin:countdown?n=20", "validation").rows
    path = write_parquet(rows, tmp_path / "cd.parquet")
    loaded = load_dataset(str(path))
    assert loaded.rows == rows
    assert isinstance(loaded[0]["reward_model"]["ground_truth"]["numbers"], list)


def test_missing_optional_fields_are_filled(tmp_path):
    p = tmp_path / "d.jsonl"
    row = _row()
    del row["extra_info"]
    row["reward_model"] = {"ground_truth": 7}
    p.write_text(json.dumps(row) + "\n\n")
    (got,) = read_rows(p)
    assert got["extra_info"] == {} and got["reward_model"]["style"] == "rule"


BAD = [
    ({"prompt": "plain text"}, "'prompt'"),
    ({"prompt": []}, "'prompt'"),
    ({"prompt": [{"role": "robot", "content": "x"}]}, "'prompt[0].role'"),
    ({"prompt": [{"role": "user", "content": 3}]}, "'prompt[0].content'"),
    ({"data_source": None}, "'data_source'"),
    ({"reward_model": "x"}, "'reward_model'"),
    ({"reward_model": {"style": "rule"}}, "'reward_model.ground_truth'"),
    ({"extra_info": [1]}, "'extra_info'"),
]


@pytest.mark.parametrize(("override", "field"), BAD)
def test_malformed_jsonl_row_names_file_row_and_field(tmp_path, override, field):
    p = tmp_path / "bad.jsonl"
    lines = [json.dumps(_row(0)), "", json.dumps(_row(1, **override))]
    p.write_text("\n".join(lines) + "\n")
    with pytest.raises(UserError) as err:
        read_rows(p)
    msg = str(err.value)
    assert str(p) in msg and "row 2 (line 3)" in msg and field in msg


# the cases a Parquet column can hold (it cannot mix e.g. a string and a struct in one column)
@pytest.mark.parametrize(("override", "field"), [BAD[i] for i in (1, 2, 4, 6)])
def test_malformed_parquet_row_names_file_row_and_field(tmp_path, override, field):
    rows = [_row(i) for i in range(3)]
    rows[2] = _row(2, **override)
    p = write_parquet(rows, tmp_path / "bad.parquet")
    with pytest.raises(UserError) as err:
        read_rows(p)
    assert str(p) in str(err.value) and "row 3" in str(err.value) and field in str(err.value)


def test_file_level_errors(tmp_path):
    with pytest.raises(UserError, match="not found"):
        read_rows(tmp_path / "nope.jsonl")
    (tmp_path / "d.csv").write_text("a,b\n")
    with pytest.raises(UserError, match="unknown data file type"):
        read_rows(tmp_path / "d.csv")
    (tmp_path / "j.jsonl").write_text('{"prompt": \n')
    with pytest.raises(UserError, match=r"j\.jsonl:1: row 1: not valid JSON"):
        read_rows(tmp_path / "j.jsonl")
    (tmp_path / "p.parquet").write_bytes(b"not parquet")
    with pytest.raises(UserError, match="cannot read Parquet"):
        read_rows(tmp_path / "p.parquet")


def test_load_dataset_specs(tmp_path):
    a = write_jsonl([_row(i) for i in range(3)], tmp_path / "a.jsonl")
    b = write_parquet([_row(i) for i in range(3, 5)], tmp_path / "b.parquet")
    both = load_dataset([str(a), str(b)])
    assert [r["prompt"][0]["content"] for r in both] == [f"q{i}" for i in range(5)]
    assert len(load_dataset(str(a), limit=2)) == 2
    ds = load_dataset("builtin:addition?digits=3&n=50", "validation", seed=2)
    assert len(ds) == 50 and ds.data_sources() == {"rlctl/addition"}
    with pytest.raises(UserError, match="split"):
        load_dataset("builtin:addition", "test")
    with pytest.raises(UserError, match="n must be"):
        load_dataset("builtin:addition?n=x")


def test_non_utf8_jsonl_names_file_row_line_and_byte_offset(tmp_path):
    p = tmp_path / "latin.jsonl"
    good = json.dumps(_row(0)).encode() + b"\n\n"
    p.write_bytes(good + b'{"prompt": "caf\xe9"}\n')
    with pytest.raises(UserError) as err:
        read_rows(p)
    msg = str(err.value)
    offset = len(good) + len(b'{"prompt": "caf')
    assert msg.startswith(f"{p}: row 2 (line 3): not UTF-8 (byte 0xe9 at byte offset {offset} of the file")
    assert "\n" not in msg


def test_deeply_nested_json_is_one_line_not_a_recursion_error(tmp_path):
    p = tmp_path / "deep.jsonl"
    p.write_text(json.dumps(_row(0)) + "\n" + "[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(UserError, match=r"deep\.jsonl:2: row 2: JSON nested too deeply") as err:
        read_rows(p)
    assert "\n" not in str(err.value)


def test_bad_json_is_file_colon_line(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text(json.dumps(_row(0)) + "\n" + '{"prompt": }\n')
    with pytest.raises(UserError, match=rf"^{p}:2: row 2: not valid JSON: Expecting value at column 12$"):
        read_rows(p)
