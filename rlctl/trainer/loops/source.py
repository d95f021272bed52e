"""Rollout sources: where the loop's batches come from, and which weights generated them.

Every ``trainer.mode`` is the same loop (:class:`~rlctl.trainer.loops.sync.Trainer`) over the same
stages, given one source (``loops/modes.py`` says which):

- :class:`~rlctl.trainer.loops.colocated.Colocated` (sync): the loop's rollout stage runs in the
  step, on the policy workers' own engine, with the weights the previous step synced.
- :class:`~rlctl.trainer.loops.pipelined.Pipeline` (one_step_off, async): the rollout stage runs
  on a thread of its own, on rollout workers of their own, batches ahead of the trainer within a
  staleness bound; ``exact`` pins each batch to one weight version (the run is reproducible).

Versions: the policy that trains step ``s`` is weight version ``s`` (the initial weights are 1,
step ``s``'s update makes ``s + 1``), so a sample of version ``v`` trained at step ``s`` lags
``s - v`` versions. A source reports each sample's version with the batch
(:attr:`Rollout.versions`); a source that swaps weights in the middle of a generation reports
each sample's oldest version there (the staleness bound then holds for every token).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from rlctl.dispatch import DataProto
from rlctl.trainer.step.stages import StageTimer


@dataclass
class Rollout:
    """The batch one step trains: generated, scored, and the weight version of each sample."""

    batch: DataProto
    versions: torch.Tensor  # (rows,) int64: the weight version each sample was generated with
    metrics: dict[str, float] = field(default_factory=dict)  # the rollout stage's own (reward/*, dapo/*, ...)

    def lag(self, step: int) -> torch.Tensor:
        """Per sample, how many versions it lags the policy step ``step`` trains (0: on-policy)."""
        return step - self.versions


RolloutStage = Callable[[StageTimer, int, Any], tuple[DataProto, dict[str, float]]]
"""The loop's rollout stage: ``(timer, step, the worker group that samples) -> (scored batch, its
metrics)``: prompts drawn from the run's stream, n responses each, rewards, DAPO's rounds."""


class RolloutSource(Protocol):
    """What the loop asks of a source; each method is called from the loop's (main) thread."""

    colocated: bool
    """Whether it samples on the policy workers' own engine, which the loop then syncs every step
    (otherwise only before a validation, which always runs there)."""

    def running(self, stage: RolloutStage, *, done: int, last: int) -> AbstractContextManager[None]:
        """Ready to hand out batches ``done + 1 .. last`` made by ``stage``; stopped on exit."""

    def next(self, step: int, timer: StageTimer) -> Rollout:
        """The batch step ``step`` trains (the seconds it took go to ``timer``)."""

    def publish(self, step: int, timer: StageTimer) -> None:
        """The policy after step ``step``'s update (version ``step + 1``) is there to sample with."""

    def staleness(self, rollout: Rollout, step: int) -> dict[str, float]:
        """What the step logs about how far ``rollout`` lags (RunError past the source's bound)."""

    def paused(self) -> AbstractContextManager[None]:
        """While held, the source generates nothing (validation runs on the policy's engine)."""

    def prompt_state(self) -> dict:
        """The prompt stream's position after the last batch trained (what a checkpoint resumes at)."""

    def save(self, checkpoint: Path, step: int) -> None:
        """Write what a resume after step ``step`` cannot make again beside the roles' shards."""

    def load(self, checkpoint: Path | None) -> None:
        """Take up what ``save`` wrote (None: a fresh start); the prompt stream is at ``prompt_state``."""
