"""The character tokenizer: round trip, special tokens, chat template, HF save/load."""

from __future__ import annotations

import string

import pytest
from hypothesis import given
from hypothesis import strategies as st
from transformers import AutoTokenizer

from rlctl.models.tokenizer import CHARACTERS, EOS, PAD, build_char_tokenizer

TEXT = st.text(alphabet=st.sampled_from(CHARACTERS), max_size=80)


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


@given(TEXT)
def test_round_trip_is_exact_and_one_token_per_character(text):
    tok = build_char_tokenizer()
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text)
    assert tok.decode(ids) == text


def test_every_character_has_its_own_id(tok):
    ids = [tok.convert_tokens_to_ids(c) for c in CHARACTERS]
    assert len(set(ids)) == len(CHARACTERS)
    assert tok.unk_token_id not in ids
    assert set(string.digits + "+-*/=() \n") <= set(CHARACTERS)


def test_special_tokens(tok):
    assert tok.pad_token == PAD and tok.pad_token_id == 0
    assert tok.eos_token == EOS
    assert len({tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id}) == 4
    # markers are single tokens, never split into characters, and skipped by decode(skip_special_tokens)
    ids = tok("<|user|>7<|assistant|>", add_special_tokens=False)["input_ids"]
    assert len(ids) == 3
    assert tok.decode(ids, skip_special_tokens=True) == "7"
    # characters outside the alphabet become <|unk|>
    assert tok("é", add_special_tokens=False)["input_ids"] == [tok.unk_token_id]


def test_chat_template(tok):
    msgs = [{"role": "user", "content": "12+34="}]
    assert (
        tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        == "<|user|>12+34=<|assistant|>"
    )
    full = [*msgs, {"role": "assistant", "content": "46"}]
    assert tok.apply_chat_template(full, tokenize=False) == "<|user|>12+34=<|assistant|>46<|eos|>"
    sys_msgs = [{"role": "system", "content": "s"}, *msgs]
    assert tok.apply_chat_template(sys_msgs, tokenize=False).startswith("<|system|>s<|user|>")
    with pytest.raises(Exception, match="unknown chat role"):
        tok.apply_chat_template([{"role": "tool", "content": "x"}], tokenize=False)


def test_save_and_load_with_autotokenizer(tok, tmp_path):
    tok.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    text = "a+b=\n<|user|>hi<|assistant|>"
    assert loaded(text)["input_ids"] == tok(text)["input_ids"]
    assert loaded.chat_template == tok.chat_template
    assert (loaded.pad_token_id, loaded.eos_token_id) == (tok.pad_token_id, tok.eos_token_id)
    assert loaded.padding_side == "left"
