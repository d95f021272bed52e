"""Character-level tokenizer for the built-in tiny models, built locally with ``tokenizers``.

Every printable ASCII character, tab and newline is one token; special tokens mark padding,
begin/end of text and the chat roles. The result is a ``transformers.PreTrainedTokenizerFast``
with a compact chat template, so it saves and loads with the ordinary HF calls
(``save_pretrained`` / ``AutoTokenizer.from_pretrained``) like any real model's tokenizer.

Chat format (one token per marker, no spaces added)::

    <|user|>12+34=<|assistant|>46<|eos|>

``add_generation_prompt=True`` ends the prompt with ``<|assistant|>``; an assistant turn ends
with ``<|eos|>``, which is also the generation stop token.
"""

from __future__ import annotations

import string

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

PAD, BOS, EOS, UNK = "<|pad|>", "<|bos|>", "<|eos|>", "<|unk|>"
ROLE_TOKENS = {"system": "<|system|>", "user": "<|user|>", "assistant": "<|assistant|>"}
SPECIAL_TOKENS: list[str] = [PAD, BOS, EOS, UNK, *ROLE_TOKENS.values()]
# printable ASCII (space .. ~) plus tab and newline; no \r, \x0b, \x0c
CHARACTERS: list[str] = [c for c in string.printable if c not in "\r\x0b\x0c"]

CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unknown chat role: ' + m['role']) }}{% endif %}"
    "{{ '<|' + m['role'] + '|>' + m['content'] }}"
    "{% if m['role'] == 'assistant' %}{{ '<|eos|>' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


def char_vocab() -> dict[str, int]:
    """Token -> id: special tokens first (pad is 0), then the characters in a fixed order."""
    tokens = SPECIAL_TOKENS + CHARACTERS
    return {tok: i for i, tok in enumerate(tokens)}


def build_char_tokenizer(model_max_length: int = 512) -> PreTrainedTokenizerFast:
    """The character tokenizer with its chat template; deterministic (no training step)."""
    vocab = char_vocab()
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    # every character (newline included) is its own pre-token
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        model_max_length=model_max_length,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    # role markers are special (skipped by decode(skip_special_tokens=True), never split)
    fast.add_special_tokens({"additional_special_tokens": list(ROLE_TOKENS.values())})
    fast.chat_template = CHAT_TEMPLATE
    return fast
