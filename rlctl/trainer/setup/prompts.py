"""The prompts of a run: the resumable train stream and the fixed validation prompts, as DataProto."""

from __future__ import annotations

from typing import Any

from rlctl.data import PromptBatcher, load_dataset
from rlctl.dispatch import DataProto
from rlctl.profile.schema import Profile


class PromptSource:
    """The train prompt stream as DataProto batches, with a resumable position."""

    def __init__(self, batcher: PromptBatcher) -> None:
        self.batcher = batcher

    def next_batch(self) -> DataProto:
        return to_proto(self.batcher.next_batch())

    def state_dict(self) -> dict[str, int]:
        return self.batcher.state_dict()

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.batcher.load_state_dict(state)


def to_proto(batch: Any) -> DataProto:
    return DataProto.from_dict(
        tensors={"input_ids": batch.input_ids, "attention_mask": batch.attention_mask},
        non_tensors=batch.non_tensors,
    )


def load_prompts(profile: Profile, tokenizer: Any) -> tuple[PromptSource, DataProto | None]:
    """Train stream plus the fixed validation prompts (the task's split, or data.val)."""
    d, seed = profile.data, profile.run.seed
    train = PromptBatcher(
        load_dataset(d.train, "train", seed=seed),
        tokenizer,
        profile.trainer.prompts_per_step,
        seed=seed,
        max_prompt_length=d.max_prompt_length,
        shuffle=d.shuffle,
    )
    val_spec = d.val or (d.train if d.train.startswith("builtin:") else "")
    if not val_spec:
        return PromptSource(train), None
    val_ds = load_dataset(val_spec, "validation", seed=seed, limit=d.val_size or None)
    val = PromptBatcher(val_ds, tokenizer, 1, seed=seed, max_prompt_length=d.max_prompt_length, shuffle=False)
    return PromptSource(train), to_proto(val.make_batch(list(range(len(val.dataset))), "val-"))
