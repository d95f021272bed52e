"""``trainer.mode = "sync"``: generate with the current weights, in the step, on the policy's own engine.

Each step's rollout stage runs on the policy workers' colocated rollout engine, which the loop
synced after the previous step's update: every sample is of version ``step`` (on-policy), and
there is nothing to publish, pause, or keep in a checkpoint.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import torch

from rlctl.trainer.loops.source import Rollout, RolloutStage
from rlctl.trainer.step.stages import StageTimer


class Colocated:
    """The sync source: the loop's rollout stage, called in the step on ``ctx.policy``."""

    colocated = True

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx
        self.stage: RolloutStage | None = None

    @contextmanager
    def running(self, stage: RolloutStage, *, done: int, last: int) -> Iterator[None]:
        self.stage = stage
        try:
            yield
        finally:
            self.stage = None

    def next(self, step: int, timer: StageTimer) -> Rollout:
        """Batch ``step``, of version ``step`` by construction: the previous step's sync (for step 1,
        the workers' start) loaded it, and its fingerprint (and canary, where due) checked it."""
        batch, metrics = self.stage(timer, step, self.ctx.policy)
        return Rollout(batch, torch.full((len(batch),), step, dtype=torch.long), metrics)

    def publish(self, step: int, timer: StageTimer) -> None:
        """Nothing: the loop's sync stage already loaded the new weights into the engine it samples."""

    def staleness(self, rollout: Rollout, step: int) -> dict[str, float]:
        """Nothing: on-policy by construction (the sync's check logs ``rollout/weight_version``)."""
        return {}

    def paused(self) -> nullcontext[None]:
        return nullcontext()

    def prompt_state(self) -> dict:
        return self.ctx.train_data.state_dict()

    def save(self, checkpoint: Path, step: int) -> None:
        """Nothing: the next batch is generated from the checkpoint's own weights."""

    def load(self, checkpoint: Path | None) -> None:
        """Nothing to take up."""
