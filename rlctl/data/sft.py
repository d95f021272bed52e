"""SFT view of a prompt dataset: templated prompt + answer + EOS, loss on the answer only.

The answer of a row is ``extra_info["answer"]`` when present (built-in tasks set it; countdown
needs it since its ground truth is not an answer text), else ``reward_model.ground_truth`` when it
is a string or number. Prompt ids + answer ids equal the chat template of the full conversation
(prompt messages + the assistant answer) for templates that end a turn with EOS, as ours does.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import torch

from rlctl.data.dataset import PromptDataset
from rlctl.errors import UserError


def sft_answer(row: dict[str, Any], where: str = "row") -> str:
    """The reference answer text of a row, or a UserError saying which field was missing."""
    answer = row.get("extra_info", {}).get("answer")
    if answer is None:
        answer = row["reward_model"]["ground_truth"]
    if isinstance(answer, bool) or not isinstance(answer, (str, int, float)):
        raise UserError(
            f"{where}: SFT needs an answer text: set extra_info.answer "
            f"(reward_model.ground_truth is {type(answer).__name__}, not a string)"
        )
    return str(answer)


class SFTDataset:
    """Items ``{"input_ids": [...], "loss_mask": [...]}``; loss_mask is 1 on answer tokens and EOS."""

    def __init__(self, dataset: PromptDataset, tokenizer: Any, max_length: int | None = None) -> None:
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.items: list[dict[str, list[int]]] = []
        self.dropped = 0
        eos = tokenizer.eos_token_id
        answers = [sft_answer(row, f"{dataset.name}: row {i + 1}") for i, row in enumerate(dataset.rows)]
        answer_ids = tokenizer(answers, add_special_tokens=False)["input_ids"] if answers else []
        for prompt, answer in zip(dataset.encode(tokenizer), answer_ids, strict=True):
            target = list(answer) + [eos]
            ids = prompt + target
            if max_length is not None and len(ids) > max_length:
                self.dropped += 1
                continue
            self.items.append({"input_ids": ids, "loss_mask": [0] * len(prompt) + [1] * len(target)})
        if not self.items:
            raise UserError(f"{dataset.name}: no SFT example fits max_length={max_length}")

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, list[int]]:
        return self.items[i]

    def collate(self, items: list[dict[str, list[int]]]) -> dict[str, torch.Tensor]:
        """Right-padded input_ids, attention_mask, loss_mask and position_ids, all [B, L]."""
        width = max(len(it["input_ids"]) for it in items)
        ids = torch.full((len(items), width), self.pad_id, dtype=torch.long)
        attn = torch.zeros((len(items), width), dtype=torch.long)
        loss = torch.zeros((len(items), width), dtype=torch.long)
        for i, it in enumerate(items):
            n = len(it["input_ids"])
            ids[i, :n] = torch.tensor(it["input_ids"])
            attn[i, :n] = 1
            loss[i, :n] = torch.tensor(it["loss_mask"])
        pos = torch.arange(width).expand(len(items), width) * attn
        return {"input_ids": ids, "attention_mask": attn, "loss_mask": loss, "position_ids": pos}

    def batches(self, batch_size: int, seed: int = 0, epoch: int = 0) -> Iterator[dict[str, torch.Tensor]]:
        """One shuffled epoch of collated batches (last partial batch kept); deterministic."""
        order = list(range(len(self.items)))
        random.Random(f"sft:{seed}:{epoch}").shuffle(order)
        for start in range(0, len(order), batch_size):
            yield self.collate([self.items[j] for j in order[start : start + batch_size]])
