"""``[actor.lora]``: the LoRA adapter section of a profile (its own module: the schema's largest
section besides the trainer's)."""

from __future__ import annotations

from dataclasses import dataclass

from rlctl.profile.fields import field


@dataclass(frozen=True)
class LoraSection:
    """``[actor.lora]``: present = train a LoRA adapter (peft) on a frozen base instead of all weights."""

    rank: int = field(16, "LoRA rank r of every adapted projection.", ge=1)
    alpha: float = field(32.0, "LoRA alpha; the update is scaled by alpha / rank.", gt=0)
    dropout: float = field(
        0.0,
        "Dropout on the adapter's input. Only 0 is accepted: with dropout the old log-probs (no "
        "dropout) and the update would differ and its RNG is not checkpointed.",
        ge=0,
        lt=1,
    )
    target_modules: list[str] = field(
        ["all-linear"],
        "Modules to adapt, by name suffix (peft's target_modules), or ['all-linear'] for every linear "
        "projection except the output head. Embedding layers are refused (train them in full with "
        "modules_to_save).",
    )
    modules_to_save: list[str] = field(
        [],
        "Modules trained in full beside the adapter (peft's modules_to_save), e.g. ['lm_head'] of a "
        "model whose embeddings are not tied (a tied half is refused).",
    )
    export_merged: bool = field(
        False, "Also export the base with the adapter merged in (RUN_DIR/hf/merged, plain transformers)."
    )
