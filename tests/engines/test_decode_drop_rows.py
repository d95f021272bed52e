"""Decode stops running finished rows: the same samples, masks and log-probs as running every row
to the end, with fewer rows through the model once enough rows have finished."""

from __future__ import annotations

import pytest
import torch

from rlctl.engines import hf_rollout
from rlctl.engines.hf_rollout import HFRolloutEngine
from tests.engines.helpers import EOS, PAD, make_batch, make_model

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    return HFRolloutEngine(make_model(tmp_path_factory.mktemp("m") / "a", seed=3))


def _prompts(batch_size: int, seed: int):
    b = make_batch(batch_size, prompt_len=6, resp_len=1, seed=seed)  # mixed left-padded lengths
    return b["input_ids"][:, :6], b["attention_mask"][:, :6]


def _generate(engine, monkeypatch, fraction: float, **kw):
    """``generate`` with ``DROP_FRACTION = fraction``; also returns the rows of each decode forward."""
    monkeypatch.setattr(hf_rollout, "DROP_FRACTION", fraction)
    rows = []
    step = engine._step

    def counting_step(input_ids, *args):
        rows.append(input_ids.shape[0])
        return step(input_ids, *args)

    monkeypatch.setattr(engine, "_step", counting_step)
    ids, mask = _prompts(kw.pop("batch_size", 6), kw.pop("prompt_seed", 0))
    out = engine.generate(ids, mask, pad_token_id=PAD, **kw)
    monkeypatch.undo()
    return out, rows[1:]  # rows[0] is the prefill


def _assert_same(got, want):
    for key in ("responses", "response_mask", "attention_mask", "input_ids", "position_ids"):
        assert torch.equal(got[key], want[key]), key
    assert torch.allclose(got["rollout_log_probs"], want["rollout_log_probs"], atol=1e-5, rtol=0)


CASES = {
    "sampled-n3": dict(n=3, temperature=0.7, seed=5, eos_token_id=[EOS, *range(5, 20)], max_new_tokens=12),
    "sampled-topk-topp": dict(
        n=2,
        temperature=1.3,
        top_k=20,
        top_p=0.9,
        seed=1,
        eos_token_id=[EOS, *range(5, 25)],
        max_new_tokens=12,
    ),
    "greedy-n2": dict(
        n=2, greedy=True, temperature=0.7, eos_token_id=[EOS, *range(5, 30)], max_new_tokens=12
    ),
    "all-finish-early": dict(
        n=2, temperature=1.0, seed=2, eos_token_id=list(range(1, 60)), max_new_tokens=12
    ),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
@pytest.mark.parametrize("fraction", [0.0, 0.25])
def test_dropping_finished_rows_changes_no_output(engine, monkeypatch, case, fraction):
    every_row, full_rows = _generate(engine, monkeypatch, float("inf"), **CASES[case])
    dropped, rows = _generate(engine, monkeypatch, fraction, **CASES[case])
    _assert_same(dropped, every_row)
    batch = every_row["responses"].shape[0]
    assert set(full_rows) <= {batch}
    finished_before_end = every_row["response_mask"][:, -1].eq(0).sum().item()
    if fraction == 0.0 and finished_before_end:
        assert min(rows, default=batch) < batch  # finished rows left the batch
    assert len(rows) == len(full_rows)  # the same number of decode steps


def test_rows_leave_once_a_quarter_of_the_running_rows_finished(engine, monkeypatch):
    out, rows = _generate(engine, monkeypatch, 0.25, **CASES["sampled-n3"], batch_size=8)
    mask = out["response_mask"]
    running = mask.shape[0]
    for t, ran in enumerate(rows):  # the forward after step t runs the rows kept after step t
        alive = int(mask[:, t + 1].sum())  # a row still unfinished after step t has a mask at t + 1
        if running - alive >= 0.25 * running:
            running = alive
        assert ran == running
    assert rows[-1] < mask.shape[0]


def test_same_samples_whether_or_not_rows_leave_for_many_seeds(engine, monkeypatch):
    for seed in range(6):
        kw = dict(
            n=4,
            temperature=0.9,
            seed=seed,
            eos_token_id=[EOS, *range(5, 15)],
            max_new_tokens=10,
            prompt_seed=seed,
        )
        _assert_same(
            _generate(engine, monkeypatch, 0.0, **kw)[0],
            _generate(engine, monkeypatch, float("inf"), **kw)[0],
        )
