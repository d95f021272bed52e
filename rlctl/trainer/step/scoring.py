"""Decode responses and score them with the profile's reward, as tensors on the step's batch."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from rlctl.algorithms import overlong_penalty
from rlctl.dispatch import DataProto
from rlctl.rewards.manager import RewardManager
from rlctl.trainer.step.stages import token_level_scores

# What score() returns besides the batch: per-pass counts, so a caller that scores several times
# in one step (DAPO rounds, ReMax's baseline) adds them up.
COUNT_METRICS = ("reward/errors", "reward/timeouts", "reward/over_limit")


class BatchScorer:
    """Adds the reward columns to a generated batch:

    - ``raw_scores``: the scorer's score;
    - ``scores``: the training reward, ``raw_scores`` plus DAPO's overlong penalty when shaping is on;
    - ``acc`` (verifiers and scorers that report it) and ``signal_acc`` (see RewardOutput);
    - ``token_level_scores``: ``scores`` on each response's last token.
    """

    def __init__(
        self,
        tokenizer: Any,
        manager: RewardManager,
        *,
        max_new_tokens: int,
        overlong_buffer: int = 0,
        overlong_penalty_factor: float = 1.0,
    ) -> None:
        self.tokenizer = tokenizer
        self.manager = manager
        self.max_new_tokens = max_new_tokens
        self.overlong_buffer = overlong_buffer
        self.overlong_penalty_factor = overlong_penalty_factor

    def decode(self, batch: DataProto) -> list[str]:
        responses, mask = batch.batch["responses"], batch.batch["response_mask"].bool()
        return self.tokenizer.batch_decode(
            [row[m].tolist() for row, m in zip(responses, mask, strict=True)], skip_special_tokens=True
        )

    def score(
        self, batch: DataProto, *, shaping: bool = True, solutions: Sequence[str] | None = None
    ) -> tuple[DataProto, dict[str, float]]:
        """The batch with its reward columns, and this pass's error/timeout counts.

        ``shaping=False`` (validation, evaluation) leaves out training-time reward shaping, so
        ``scores`` is what the scorer gave. ``solutions`` (one per row) are scored instead of the
        decoded responses: an agent's returned final answers (:mod:`rlctl.agents.outcome`).
        """
        nt = batch.non_tensor
        if solutions is not None and len(solutions) != len(batch):
            raise ValueError(f"{len(solutions)} solutions for a batch of {len(batch)} rows")
        out = self.manager.score(
            list(nt["data_source"]),
            list(solutions) if solutions is not None else self.decode(batch),
            list(nt["ground_truth"]),
            list(nt["extra_info"]),
            prompts=list(nt["raw_prompt"]) if "raw_prompt" in nt else None,
        )
        raw = torch.tensor(out.scores, dtype=torch.float32)
        tensors: dict[str, torch.Tensor] = {
            "raw_scores": raw,
            "signal_acc": torch.tensor(out.signal_acc, dtype=torch.float32),
        }
        if out.acc is not None:
            tensors["acc"] = torch.tensor(out.acc, dtype=torch.float32)
        scores = raw
        if shaping and self.overlong_buffer > 0:
            lengths = batch.batch["response_mask"].sum(-1)
            scores = raw + overlong_penalty(
                lengths, self.max_new_tokens, self.overlong_buffer, self.overlong_penalty_factor
            )
        tensors["scores"] = scores
        tensors["token_level_scores"] = token_level_scores(scores, batch.batch["response_mask"])
        metrics = {k: float(out.metrics.get(k, 0.0)) for k in COUNT_METRICS}
        return batch.union(DataProto.from_dict(tensors=tensors)), metrics


def add_counts(total: dict[str, float], more: dict[str, float]) -> dict[str, float]:
    """``total`` with ``more``'s counts added key by key (in place; returned for chaining)."""
    for k, v in more.items():
        total[k] = total.get(k, 0.0) + v
    return total
