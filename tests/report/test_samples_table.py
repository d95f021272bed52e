"""The samples section of report.md: escaping that renders any text as itself, which rows are shown."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st
from markdown_it import MarkdownIt

from rlctl.report import build_report
from rlctl.report.samples import clip, md_cell, samples_markdown

GFM = MarkdownIt("commonmark").enable(["table", "strikethrough"])
# Markup-heavy alphabet: markdown and HTML syntax, escapes, newlines, control and non-ASCII characters.
TEXTS = st.lists(
    st.one_of(
        st.sampled_from(list("|\\`*_[]()<>&#;!~$:/-+=.?\n\r\t ") + ["<|im_end|>", "<s>", "&amp;", "http://"]),
        st.characters(codec="utf-8", exclude_categories=("Cs",)),
    ),
    max_size=40,
).map("".join)


def rendered_cell(cell: str) -> str:
    """The text a GFM renderer shows for one table cell holding ``cell`` (``<br>`` as a newline)."""
    out = GFM.render(f"| head | other |\n|---|---|\n| {cell} | end |\n")
    cells = re.findall(r"<td>(.*?)</td>", out, flags=re.S)
    assert len(cells) == 2 and cells[1] == "end", out  # no pipe of the text split the row
    return html.unescape(cells[0].replace("<br>", "\n"))


def expected_text(text: str) -> str:
    """What the cell must show: the text with newlines normalised and its control characters
    written as \\xNN, minus the outer whitespace a table cell never keeps."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = "".join(
        f"\\x{ord(c):02x}" if (ord(c) < 32 and c not in "\n\t") or ord(c) == 127 else c for c in text
    )
    return text.strip()


@given(TEXTS)
def test_any_text_renders_as_itself_in_one_table_cell(text):
    cell = md_cell(text)
    assert "\n" not in cell and "\r" not in cell
    shown = rendered_cell(cell)
    # a renderer's whitespace trimming aside, the text is shown exactly: no markup, no lost characters
    assert shown.strip() == expected_text(text)


@given(TEXTS, st.integers(min_value=5, max_value=40))
def test_clipped_text_keeps_head_and_tail_around_an_ellipsis(text, limit):
    out = clip(text, limit)
    if len(text) <= limit:
        assert out == text
    else:
        cut = (limit - 1) // 2
        assert len(out) == limit and out[cut] == "…"
        assert text.startswith(out[:cut]) and text.endswith(out[cut + 1 :])


def test_special_tokens_stay_readable_in_the_raw_file():
    assert md_cell("<|im_start|>user\nWhat is 7 + 5?<|im_end|>") == (
        "<\\|im_start\\|>user<br>What is 7 + 5?<\\|im_end\\|>"
    )
    assert md_cell("<s>12</s>") == "\\<s>12\\</s>"  # would be HTML (strikethrough) unescaped


def row(step: int, phase: str, i: int, start: int = 0, **extra) -> dict:
    return {
        "step": step,
        "phase": phase,
        "prompt": f"<|user|>{i}+{i}=<|assistant|>",
        "response": f"{2 * i}<|eos|>",
        "score": 1.0,
        "ground_truth": str(2 * i),
        "acc": 1.0,
        "response_length": 3,
        "weight_version": step + 1,
        "uid": f"u{i}",
        "start_step": start,
        **extra,
    }


def write_samples(run_dir: Path, rows: list[dict], tail: str = "") -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + tail)


def section(md: str, title: str) -> str:
    start = md.index(f"### {title}")
    end = md.find("\n### ", start + 1)
    return md[start : end if end >= 0 else len(md)]


def test_tables_show_latest_and_first_validation_and_latest_training(tmp_path):
    rows = [row(0, "val", i) for i in range(2)]
    rows += [row(2, "train", i + 10) for i in range(2)] + [row(2, "val", i + 20) for i in range(2)]
    rows += [row(4, "train", i + 30) for i in range(2)] + [row(4, "val", i + 40) for i in range(2)]
    write_samples(tmp_path, rows, tail='{"step": 5, "phase": "tr')  # a killed run's half line
    md, shown = samples_markdown(tmp_path)
    titles = re.findall(r"^### (.*)$", md, flags=re.M)
    assert titles == [
        "Validation, step 4 (latest), weights v5",
        "Validation, step 0 (first), weights v1",
        "Training, step 4 (latest), weights v5",
    ]
    assert shown == 6
    assert "<\\|user\\|>40+40=<\\|assistant\\|> | 80<\\|eos\\|> | 80 | 1 | 1 | 3 |" in section(md, titles[0])
    assert "0+0=" in section(md, titles[1]) and "30+30=" in section(md, titles[2])
    assert "20+20=" not in md and "1 unreadable lines skipped" in md


def test_after_a_resume_the_resumed_runs_rows_are_the_latest(tmp_path):
    # Interrupted run validated at 4 (after its checkpoint at 2); the resumed run (start_step 2)
    # validated at 3 and is the newest: its rows are shown, not the discarded attempt's.
    rows = [row(2, "val", 1), row(4, "val", 2), row(3, "val", 3, start=2)]
    write_samples(tmp_path, rows)
    md, _ = samples_markdown(tmp_path)
    assert "### Validation, step 3 (latest)" in md and "3+3=" in section(md, "Validation, step 3")
    assert "2+2=" not in md


def test_long_text_is_cut_with_an_ellipsis(tmp_path):
    long = "Q" * 200 + "|middle|" + "A" * 200
    write_samples(tmp_path, [row(0, "val", 1, prompt=long, response="x\ny" * 400)])
    md, _ = samples_markdown(tmp_path)
    table_row = next(line for line in md.splitlines() if line.startswith("| QQQ"))
    prompt_cell = table_row.split(" | ")[0]
    assert "…" in prompt_cell and "middle" not in prompt_cell and prompt_cell.endswith("AAA")
    assert len(table_row) < 2500 and "x<br>y" in table_row


def test_no_samples_file_says_so(tmp_path):
    md, shown = samples_markdown(tmp_path)
    assert shown == 0 and "No samples recorded" in md


def test_report_md_holds_the_samples_table_after_the_plots(synthetic_run, monkeypatch):
    from rlctl.report import plots

    monkeypatch.setattr(plots, "PLOTS", {"val_accuracy": plots.PLOTS["val_accuracy"]})  # one is enough here
    write_samples(synthetic_run, [row(120, "val", i) for i in range(3)])
    report = build_report(synthetic_run)
    md = (synthetic_run / "report.md").read_text()
    assert md.index("![val_accuracy]") < md.index("## Samples") < md.index("### Validation, step 120")
    assert "| prompt | response | ground truth | score | acc | tokens |" in md
    assert report.sample_rows == 3 and report.to_dict()["sample_rows"] == 3
