"""The bare-model reference of ``rlctl bench step``: the work it times and the shapes it builds, never its timings."""

from __future__ import annotations

import functools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlctl.bench import step_bare
from rlctl.bench.step_bare import bare_model_ratios, bare_model_shape, measure_bare_model, step_rows
from tests.engines.helpers import make_model


@settings(max_examples=60, deadline=None)
@given(
    prompts=st.integers(1, 6),
    n=st.integers(1, 8),
    prompt_tokens=st.integers(1, 12),
    response=st.floats(1.0, 9.0),
)
def test_rows_hold_the_mean_response_length_in_whole_tokens(prompts, n, prompt_tokens, response):
    prompt, ids, mask, positions, width = step_rows(prompts, n, prompt_tokens, response, vocab=50)
    rows = prompts * n
    resp = mask[:, prompt_tokens:]
    assert int(resp.sum()) == max(rows, round(response * rows))  # the mean, to a token over the step
    assert int(resp.sum(-1).max() - resp.sum(-1).min()) <= 1 and width == int(resp.sum(-1).max())
    assert bool(
        (resp == (torch.arange(width) < resp.sum(-1, keepdim=True)).long()).all()
    )  # ones, then padding
    assert torch.equal(ids[:, :prompt_tokens], prompt.repeat_interleave(n, 0))  # n adjacent rows per prompt
    assert torch.equal(positions[:, : prompt_tokens + 1], torch.arange(prompt_tokens + 1).expand(rows, -1))


def _stage_threads(monkeypatch) -> list[int]:
    """Record the thread count of every stage the reference times (each once after its warm-up)."""
    seen: list[int] = []
    monkeypatch.setattr(step_bare, "MIN_REPEATS", 1)
    monkeypatch.setattr(step_bare, "MAX_REPEATS", 1)
    real = step_bare._on_threads

    def on_threads(threads, fn):
        seen.append(threads)
        return real(threads, fn)

    monkeypatch.setattr(step_bare, "_on_threads", on_threads)
    return seen


def test_the_bare_model_times_the_packed_update_of_the_kept_groups_and_one_decode_pass_per_token(
    tmp_path, monkeypatch
):
    from transformers import Qwen2ForCausalLM

    model_dir = make_model(tmp_path / "m")
    calls: list[tuple[int, ...]] = []
    real_forward = Qwen2ForCausalLM.forward

    @functools.wraps(real_forward)  # keeps the signature the reference reads the cache keyword from
    def forward(self, input_ids=None, **kw):
        calls.append(tuple(input_ids.shape))
        return real_forward(self, input_ids=input_ids, **kw)

    monkeypatch.setattr(Qwen2ForCausalLM, "forward", forward)
    threads = _stage_threads(monkeypatch)
    bare = measure_bare_model(
        model_dir,
        prompts=3,
        n=4,
        prompt_tokens=5,
        response_tokens=2.5,
        threads=2,
        update_prompts=2,
        split_threads=(1, 1),
    )
    assert threads == [2, 2, 1, 1]  # gen, update on the sync threads; then each side's
    gen = [(3, 5), (12, 1), (12, 1)]  # distinct prompts once, then width - 1 = 2 decode passes of every row
    # the kept groups only, one packed row each: its prompt, 4 segments of <= 3 + 1 tokens
    update = [(2, 5 - 1 + 4 * (1 + 3))]
    per_stage = gen * 2 + update * 2  # warm-up + one timed call
    assert calls == per_stage * 2
    assert bare["step_s"] == pytest.approx(bare["gen_s"] + bare["update_s"])
    assert bare["overlapped_step_s"] == max(bare["gen_split_s"], bare["update_split_s"])
    assert bare["response_tokens"] == 2.5 and bare["split_threads"] == [1, 1] and bare["update_prompts"] == 2


def test_rows_are_measured_against_the_lower_bare_step_and_shaped_by_the_first_run():
    rows = [{"name": "sync", "s_per_step": 0.06}, {"name": "trl", "s_per_step": 0.12}]
    assert bare_model_ratios(rows, {"step_s": 0.05, "overlapped_step_s": 0.03}) == {
        "sync_s_per_step_vs_bare_model": pytest.approx(2.0),
        "trl_s_per_step_vs_bare_model": pytest.approx(4.0),
    }
    assert bare_model_ratios(rows, {"step_s": 0.04}) == {
        "sync_s_per_step_vs_bare_model": pytest.approx(1.5),
        "trl_s_per_step_vs_bare_model": pytest.approx(3.0),
    }
    # 64 rows of 11.6 real tokens, 3.6 of them response: 8 prompt tokens a row
    assert bare_model_shape({"tokens_per_step": 742.4, "response_tokens": 3.6}, 64) == (8, 3.6)
