"""Decode responses and score them with the profile's reward, as tensors on the step's batch."""

from __future__ import annotations

from typing import Any

import torch

from rlctl.algorithms import overlong_penalty
from rlctl.dispatch import DataProto
from rlctl.rewards.manager import RewardManager
from rlctl.trainer.stages import token_level_scores


class BatchScorer:
    """Adds ``scores``, ``acc`` (verifiers) and ``token_level_scores`` to a generated batch."""

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
        self._metrics: dict[str, float] = {}

    def decode(self, batch: DataProto) -> list[str]:
        responses, mask = batch.batch["responses"], batch.batch["response_mask"].bool()
        return self.tokenizer.batch_decode(
            [row[m].tolist() for row, m in zip(responses, mask, strict=True)], skip_special_tokens=True
        )

    def score(self, batch: DataProto) -> DataProto:
        nt = batch.non_tensor
        out = self.manager.score(
            list(nt["data_source"]),
            self.decode(batch),
            list(nt["ground_truth"]),
            list(nt["extra_info"]),
            prompts=list(nt["raw_prompt"]) if "raw_prompt" in nt else None,
        )
        scores = torch.tensor(out.scores, dtype=torch.float32)
        tensors: dict[str, torch.Tensor] = {}
        if out.acc is not None:
            tensors["acc"] = torch.tensor(out.acc, dtype=torch.float32)
        if self.overlong_buffer > 0:
            lengths = batch.batch["response_mask"].sum(-1)
            scores = scores + overlong_penalty(
                lengths, self.max_new_tokens, self.overlong_buffer, self.overlong_penalty_factor
            )
        tensors["scores"] = scores
        tensors["token_level_scores"] = token_level_scores(scores, batch.batch["response_mask"])
        # The manager's error/timeout counters; score and accuracy come from batch_metrics.
        self._metrics = {
            f"reward/{k.removeprefix('reward/')}": float(v)
            for k, v in out.metrics.items()
            if "error" in k or "timeout" in k
        }
        return batch.union(DataProto.from_dict(tensors=tensors))

    def last_metrics(self) -> dict[str, float]:
        """Error/timeout counts of the last scored batch."""
        return dict(self._metrics)
