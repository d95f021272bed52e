"""Batches of left-padded prompts for rollout, with a resumable position.

Order: each epoch is a permutation of the dataset drawn from ``random.Random(f"{seed}:{epoch}")``,
so the state (epoch, cursor, seed) is all a resumed run needs to see exactly the same prompts.
An epoch's tail shorter than ``batch_prompts`` is skipped (drop-last), as verl's sampler does.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from rlctl.data.dataset import PromptDataset
from rlctl.errors import UserError


@dataclass
class PromptBatch:
    """Tensors [B, L] (left-padded) plus per-row non-tensor columns (lists of length B)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    non_tensors: dict[str, list[Any]]

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def tensors(self) -> dict[str, torch.Tensor]:
        return {
            "input_ids": self.input_ids,
            "attention_mask": self.attention_mask,
            "position_ids": self.position_ids,
        }


def left_pad(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask, position_ids) of ``seqs`` left-padded to the longest one."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        if s:
            ids[i, width - len(s) :] = torch.tensor(s, dtype=torch.long)
            mask[i, width - len(s) :] = 1
    position_ids = (mask.cumsum(dim=1) - 1).clamp(min=0) * mask  # verl's compute_position_id_with_mask
    return ids, mask, position_ids


class PromptBatcher:
    """Yields ``PromptBatch`` es of ``batch_prompts`` rows; ``state_dict`` resumes the stream."""

    def __init__(
        self,
        dataset: PromptDataset,
        tokenizer: Any,
        batch_prompts: int,
        seed: int = 0,
        max_prompt_length: int | None = None,
        shuffle: bool = True,
    ) -> None:
        if batch_prompts < 1:
            raise UserError(f"batch_prompts must be >= 1, got {batch_prompts}")
        encoded = dataset.encode(tokenizer)
        if max_prompt_length is not None:
            dataset, encoded = dataset.select_by_length(encoded, max_prompt_length)
        if len(dataset) < batch_prompts:
            raise UserError(f"{dataset.name}: {len(dataset)} rows, fewer than batch_prompts={batch_prompts}")
        self.dataset = dataset
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.encoded = encoded
        self.batch_prompts = batch_prompts
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        self.cursor = 0
        self._order = self._epoch_order(0)

    @property
    def steps_per_epoch(self) -> int:
        return len(self.dataset) // self.batch_prompts

    def _epoch_order(self, epoch: int) -> list[int]:
        order = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(f"{self.seed}:{epoch}").shuffle(order)
        return order

    def make_batch(self, indices: list[int], uid_prefix: str = "") -> PromptBatch:
        """The batch of the given dataset rows (uids are ``<prefix><row index>``)."""
        ids, mask, pos = left_pad([self.encoded[i] for i in indices], self.pad_id)
        rows = [self.dataset.rows[i] for i in indices]
        non_tensors = {
            "data_source": [r["data_source"] for r in rows],
            "ground_truth": [r["reward_model"]["ground_truth"] for r in rows],
            "reward_style": [r["reward_model"].get("style", "rule") for r in rows],
            "extra_info": [r["extra_info"] for r in rows],
            "raw_prompt": [r["prompt"] for r in rows],
            "index": list(indices),
            "uid": [f"{uid_prefix}{i}" for i in indices],
        }
        return PromptBatch(ids, mask, pos, non_tensors)

    def next_batch(self) -> PromptBatch:
        """The next training batch; rolls over to a fresh permutation at the end of an epoch."""
        if self.cursor + self.batch_prompts > len(self._order):
            self.epoch += 1
            self.cursor = 0
            self._order = self._epoch_order(self.epoch)
        indices = self._order[self.cursor : self.cursor + self.batch_prompts]
        batch = self.make_batch(indices, uid_prefix=f"e{self.epoch}-")
        self.cursor += self.batch_prompts
        return batch

    def __iter__(self) -> Iterator[PromptBatch]:
        while True:
            yield self.next_batch()

    def iter_epoch(self, batch_size: int | None = None) -> Iterator[PromptBatch]:
        """One pass over every row in dataset order (validation); does not touch the state."""
        size = batch_size or self.batch_prompts
        for start in range(0, len(self.dataset), size):
            yield self.make_batch(list(range(start, min(start + size, len(self.dataset)))), "val-")

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "cursor": self.cursor, "seed": self.seed, "size": len(self.dataset)}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Resume where ``state`` was taken; refuses a state from a different dataset or seed."""
        if state.get("seed") != self.seed or state.get("size") != len(self.dataset):
            raise UserError(
                f"data state (seed {state.get('seed')}, {state.get('size')} rows) does not match this "
                f"dataset (seed {self.seed}, {len(self.dataset)} rows)"
            )
        self.epoch, self.cursor = int(state["epoch"]), int(state["cursor"])
        self._order = self._epoch_order(self.epoch)
