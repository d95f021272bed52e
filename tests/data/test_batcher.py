"""Prompt batches: left padding, epochs, resumable position, length filtering."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlctl.data import PromptBatcher, PromptDataset, encode_prompt, left_pad, load_dataset
from rlctl.errors import UserError
from rlctl.models import build_char_tokenizer

TOK = build_char_tokenizer()


def _ds(n=37):
    rows = [
        {
            "prompt": [{"role": "user", "content": "x" * (1 + i % 7)}],
            "data_source": "s",
            "reward_model": {"ground_truth": str(i), "style": "rule"},
            "extra_info": {"i": i},
        }
        for i in range(n)
    ]
    return PromptDataset(rows, "toy")


@given(st.lists(st.lists(st.integers(1, 50), max_size=9), min_size=1, max_size=6))
def test_left_pad(seqs):
    ids, mask, pos = left_pad(seqs, pad_id=0)
    width = max(len(s) for s in seqs)
    assert ids.shape == mask.shape == pos.shape == (len(seqs), width)
    for i, s in enumerate(seqs):
        assert ids[i, width - len(s) :].tolist() == s
        assert mask[i].tolist() == [0] * (width - len(s)) + [1] * len(s)
        assert pos[i, width - len(s) :].tolist() == list(range(len(s)))


def test_batch_contents_match_rows():
    ds = load_dataset("builtin:addition?n=64")
    b = PromptBatcher(ds, TOK, batch_prompts=8, seed=0)
    batch = b.next_batch()
    assert len(batch) == 8
    for j, idx in enumerate(batch.non_tensors["index"]):
        row = ds[idx]
        ids = encode_prompt(TOK, row["prompt"])
        assert batch.input_ids[j][batch.attention_mask[j].bool()].tolist() == ids
        assert batch.non_tensors["ground_truth"][j] == row["reward_model"]["ground_truth"]
        assert batch.non_tensors["data_source"][j] == "rlctl/addition"
    assert len(set(batch.non_tensors["uid"])) == 8


def test_each_epoch_is_a_permutation_with_drop_last():
    b = PromptBatcher(_ds(37), TOK, batch_prompts=5, seed=1)
    assert b.steps_per_epoch == 7
    seen = [i for _ in range(7) for i in b.next_batch().non_tensors["index"]]
    assert len(seen) == len(set(seen)) == 35
    first_of_epoch1 = b.next_batch()
    assert b.state_dict()["epoch"] == 1 and b.state_dict()["cursor"] == 5
    epoch0_order = seen[:5]
    assert first_of_epoch1.non_tensors["index"] != epoch0_order  # a fresh permutation


@given(st.integers(0, 30), st.integers(0, 3))
def test_resume_sees_the_same_prompts(steps_before, seed):
    a = PromptBatcher(_ds(23), TOK, batch_prompts=4, seed=seed)
    for _ in range(steps_before):
        a.next_batch()
    state = a.state_dict()
    expected = [a.next_batch().non_tensors["uid"] for _ in range(8)]
    b = PromptBatcher(_ds(23), TOK, batch_prompts=4, seed=seed)
    b.load_state_dict(state)
    assert [b.next_batch().non_tensors["uid"] for _ in range(8)] == expected


def test_state_from_another_dataset_is_refused():
    a = PromptBatcher(_ds(23), TOK, batch_prompts=4, seed=0)
    b = PromptBatcher(_ds(24), TOK, batch_prompts=4, seed=0)
    with pytest.raises(UserError, match="does not match"):
        b.load_state_dict(a.state_dict())


def test_prompt_length_filter():
    ds = _ds(14)  # contents of length 1..7; template adds 2 tokens
    b = PromptBatcher(ds, TOK, batch_prompts=2, max_prompt_length=5)
    assert len(b.dataset) == 6 and b.dataset.dropped == 8
    assert b.next_batch().input_ids.shape[1] <= 5
    with pytest.raises(UserError, match="every prompt is longer"):
        PromptBatcher(ds, TOK, batch_prompts=2, max_prompt_length=2)
    with pytest.raises(UserError, match="fewer than batch_prompts"):
        PromptBatcher(ds, TOK, batch_prompts=20)


def test_iter_epoch_covers_every_row_in_order_without_touching_state():
    b = PromptBatcher(_ds(11), TOK, batch_prompts=4, seed=0)
    b.next_batch()
    state = b.state_dict()
    idx = [i for batch in b.iter_epoch(batch_size=3) for i in batch.non_tensors["index"]]
    assert idx == list(range(11))
    assert b.state_dict() == state
