"""samples.jsonl: readable rows at each validation and every K steps, appended across a resume."""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from hypothesis import given
from hypothesis import strategies as st

from rlctl.dispatch import DataProto
from rlctl.report.samples import md_cell, samples_markdown
from rlctl.trainer.state.samples import SampleLog, pick_rows
from tests.cli_runner import run_cli

SMALL_VAL = ("--set", "data.val_size=4")
SAMPLES = "log_samples = 3\nlog_samples_every = 2\nexport_hf = false\n"
PROMPT = re.compile(r"^<\|user\|>(\d+)\+(\d+)=<\|assistant\|>$")  # the tiny model's chat template


def rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]


def writes(records: list[dict]) -> list[tuple[int, str, int]]:
    """(step, phase, rows) of each consecutive group of rows."""
    out: list[tuple[int, str, int]] = []
    for r in records:
        if out and out[-1][:2] == (r["step"], r["phase"]):
            out[-1] = (r["step"], r["phase"], out[-1][2] + 1)
        else:
            out.append((r["step"], r["phase"], 1))
    return out


def check_readable(records: list[dict], tokenizer) -> None:
    for r in records:
        m = PROMPT.match(r["prompt"])
        assert m, r["prompt"]  # decoded, template and special tokens as the model saw them
        assert r["ground_truth"] == str(int(m[1]) + int(m[2]))  # each row's own ground truth
        ids = tokenizer(r["response"], add_special_tokens=False)["input_ids"]
        assert len(ids) == r["response_length"] > 0  # the whole response, special tokens kept
        if r["response_length"] < 4:  # stopped before max_new_tokens: at its end token
            assert r["response"].endswith(tokenizer.eos_token)
        assert r["score"] in (0.0, 1.0) and r["acc"] == r["score"]
        assert isinstance(r["weight_version"], int)


def test_train_writes_readable_samples_and_a_resume_appends(write_profile, tmp_path, tiny_model):
    from transformers import AutoTokenizer

    profile = write_profile("samples", steps=4, extra=SAMPLES)
    run = tmp_path / "runs/samples"
    code, _, err = run_cli("--log-format", "plain", "train", str(profile), *SMALL_VAL, "--max-steps", "2")
    assert code == 0, err
    first = rows(run)
    # validation at 0 and 2 (3 prompts each), training at step 2 (every 2, and the last of this process)
    assert writes(first) == [(0, "val", 3), (2, "train", 3), (2, "val", 3)]
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    check_readable(first, tokenizer)
    assert [r["uid"] for r in first if r["phase"] == "val"] == ["val-0", "val-1", "val-2"] * 2
    train = [r for r in first if r["phase"] == "train"]
    assert len({r["uid"] for r in train}) == 3  # three prompts, not three responses of one
    assert {r["start_step"] for r in first} == {0}
    shown = err.index("first prompt, as rendered for the model")  # at start, before any generation
    assert shown < err.index("] validation") and "text='<|user|>" in err[shown:]
    assert err.count("val sample") == 2  # one sample on the console per validation

    code, _, err = run_cli("--log-format", "plain", "train", str(profile), *SMALL_VAL, "--resume", "auto")
    assert code == 0, err
    both = rows(run)
    assert both[: len(first)] == first  # appended, never rewritten
    added = both[len(first) :]
    assert writes(added) == [(4, "train", 3), (4, "val", 3)]
    assert {r["start_step"] for r in added} == {2}
    check_readable(added, tokenizer)

    md, _ = samples_markdown(run)  # report.md's samples section (tests/report: it is in report.md)
    for title in ("Validation, step 4 (latest)", "Validation, step 0 (first)", "Training, step 4 (latest)"):
        assert f"### {title}" in md
    assert "| prompt | response | ground truth | score | acc | tokens |" in md
    for r in added[3:]:  # the latest validation's rows, escaped for the table
        assert f"| {md_cell(r['prompt'])} | {md_cell(r['response'])} | {r['ground_truth']} |" in md


def test_log_samples_zero_writes_nothing(write_profile, tmp_path):
    profile = write_profile(
        "quiet", steps=1, extra="log_samples = 0\nlog_samples_every = 1\nexport_hf = false\n"
    )
    code, _, err = run_cli("--log-format", "plain", "train", str(profile), *SMALL_VAL)
    assert code == 0, err
    assert not (tmp_path / "runs/quiet/samples.jsonl").exists()
    assert "val sample" not in err


class CharTokenizer:
    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(chr(ord("a") + i) for i in ids)


def scored_batch(size: int) -> DataProto:
    return DataProto.from_dict(
        tensors={
            "input_ids": torch.arange(size * 3).view(size, 3) % 26,
            "attention_mask": torch.ones(size, 3, dtype=torch.long),
            "responses": torch.arange(size * 2).view(size, 2) % 26,
            "response_mask": torch.ones(size, 2, dtype=torch.long),
            "scores": torch.ones(size),
        },
        non_tensors={"ground_truth": [str(i) for i in range(size)], "uid": [f"u{i}" for i in range(size)]},
    )


def test_a_fresh_start_moves_an_earlier_runs_samples_aside(tmp_path):
    (tmp_path / "samples.jsonl").write_text('{"step": 9, "phase": "val"}\n')
    log = SampleLog(tmp_path, CharTokenizer(), count=2, every=1, group=1, total_steps=3, start_step=None)
    log.validation(scored_batch(4), 0)
    moved = list(tmp_path.glob("samples.prev-*.jsonl"))
    assert len(moved) == 1 and moved[0].read_text() == '{"step": 9, "phase": "val"}\n'
    assert [r["uid"] for r in rows(tmp_path)] == ["u0", "u1"]
    resumed = SampleLog(tmp_path, CharTokenizer(), count=2, every=1, group=1, total_steps=3, start_step=1)
    resumed.training(scored_batch(4), 2)
    assert [(r["step"], r["start_step"]) for r in rows(tmp_path)] == [(0, 0), (0, 0), (2, 1), (2, 1)]
    assert len(list(tmp_path.glob("samples.prev-*.jsonl"))) == 1


@given(st.integers(0, 12), st.integers(1, 4), st.integers(0, 20))
def test_picked_rows_cover_distinct_prompts_first(groups, n, count):
    picked = pick_rows(groups * n, n, count)
    assert len(picked) == min(count, groups * n) and len(set(picked)) == len(picked)
    prompts = [i // n for i in picked]
    assert prompts[: min(count, groups)] == list(range(min(count, groups)))
