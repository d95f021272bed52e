"""HF export of a LoRA actor: peft's adapter directory, and optionally the merged plain model.

The adapter directory is what ``peft.PeftModel.from_pretrained(base, DIR)`` loads:
``adapter_config.json`` (the ``LoraConfig``, ``base_model_name_or_path`` = the model path) and
``adapter_model.safetensors`` under peft's saved names (:func:`rlctl.engines.lora.adapter_state`).
``merged/`` is the base with ``W + B @ A * alpha / r`` folded in, a directory plain
``transformers.AutoModelForCausalLM.from_pretrained`` loads.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch

from rlctl.engines.lora import ADAPTER_FILE, LoraSpec, adapter_state, merged_state

MERGED_DIR = "merged"


def save_lora(engine: Any, state: dict[str, torch.Tensor], path: Path, tokenizer, tokenizer_files) -> None:
    """Rank 0: write the adapter directory at ``path`` (+ ``path/merged`` when the spec asks)."""
    from safetensors.torch import save_file

    spec: LoraSpec = engine.lora
    path.mkdir(parents=True, exist_ok=True)
    save_file(adapter_state(state), str(path / ADAPTER_FILE), metadata={"format": "pt"})
    spec.peft_config(base_model_path=str(engine.model_path)).save_pretrained(str(path))
    targets = [path]
    if spec.export_merged:
        merged = path / MERGED_DIR
        save_merged(engine.model_path, merged_state(state, spec), merged)
        targets.append(merged)
    for target in targets:
        if tokenizer is not None:
            tokenizer.save_pretrained(str(target))
        else:
            for name in tokenizer_files:
                if (Path(engine.model_path) / name).is_file():
                    shutil.copy2(Path(engine.model_path) / name, target / name)


def save_merged(model_path: str | Path, merged: dict[str, torch.Tensor], out: Path) -> None:
    """The base model of ``model_path`` with ``merged`` weights copied in (ties kept), saved to ``out``."""
    from rlctl.engines.hf_model import load_causal_lm

    model = load_causal_lm(model_path, dtype="float32", trust_remote_code=False, attn_implementation="sdpa")
    own = model.state_dict()
    missing = [k for k in own if k not in merged]
    if missing:
        raise RuntimeError(f"merged LoRA state lacks {len(missing)} tensor(s) of the base, first {missing[0]!r}")
    with torch.no_grad():
        for name, tensor in own.items():
            tensor.copy_(merged[name].to(tensor.dtype))
    model.save_pretrained(str(out))
