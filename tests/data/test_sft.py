"""SFT view: prompt + answer + EOS, loss on the answer only, same ids as the full chat template."""

from __future__ import annotations

import pytest

from rlctl.data import PromptDataset, SFTDataset, load_dataset
from rlctl.errors import UserError
from rlctl.models import build_char_tokenizer

TOK = build_char_tokenizer()


def test_ids_equal_the_full_conversation_template():
    ds = load_dataset("builtin:addition?n=20", "validation")
    sft = SFTDataset(ds, TOK)
    for row, item in zip(ds, sft.items, strict=True):
        answer = row["extra_info"]["answer"]
        conv = [*row["prompt"], {"role": "assistant", "content": answer}]
        text = TOK.apply_chat_template(conv, tokenize=False)
        assert item["input_ids"] == TOK(text, add_special_tokens=False)["input_ids"]
        masked = [t for t, m in zip(item["input_ids"], item["loss_mask"], strict=True) if m]
        assert masked == TOK(answer, add_special_tokens=False)["input_ids"] + [TOK.eos_token_id]


def test_collate_right_pads_and_masks():
    sft = SFTDataset(load_dataset("builtin:countdown?n=8", "validation"), TOK)
    batch = sft.collate([sft[0], sft[1], sft[2]])
    for i in range(3):
        n = len(sft[i]["input_ids"])
        assert batch["attention_mask"][i].sum() == n
        assert batch["input_ids"][i, :n].tolist() == sft[i]["input_ids"]
        assert (batch["input_ids"][i, n:] == TOK.pad_token_id).all()
        assert batch["loss_mask"][i, :n].tolist() == sft[i]["loss_mask"]
        assert batch["loss_mask"][i, n:].sum() == 0


def test_batches_cover_the_dataset_deterministically():
    sft = SFTDataset(load_dataset("builtin:addition?n=10"), TOK)
    a = [b["input_ids"].tolist() for b in sft.batches(4, seed=0)]
    assert a == [b["input_ids"].tolist() for b in sft.batches(4, seed=0)]
    assert sum(len(x) for x in a) == 10


def test_ground_truth_is_the_answer_when_no_extra_answer_and_errors_otherwise():
    row = {
        "prompt": [{"role": "user", "content": "hi"}],
        "data_source": "s",
        "reward_model": {"ground_truth": "yo"},
        "extra_info": {},
    }
    sft = SFTDataset(PromptDataset([row]), TOK)
    assert TOK.decode(sft[0]["input_ids"]).endswith("<|assistant|>yo<|eos|>")
    bad = {**row, "reward_model": {"ground_truth": {"target": 3}}}
    with pytest.raises(UserError, match="row 1: SFT needs an answer"):
        SFTDataset(PromptDataset([bad], "f.jsonl"), TOK)


def test_max_length_drops_long_examples():
    ds = load_dataset("builtin:addition?n=10")
    assert len(SFTDataset(ds, TOK, max_length=12)) == 10
    with pytest.raises(UserError, match="no SFT example fits"):
        SFTDataset(ds, TOK, max_length=5)
