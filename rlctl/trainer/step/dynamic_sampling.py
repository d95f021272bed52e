"""DAPO's dynamic sampling across a step's generation rounds: keep the groups with signal.

verl's recipe/dapo/dapo_ray_trainer.py keeps the groups whose ``algorithm.dynamic_sampling_metric``
(accuracy by default, never the length-shaped reward) varies and generates more rounds until the
batch is full or ``max_sampling_rounds`` is spent. Where verl then raises, the batch is refilled
with zero-signal groups, and that is reported (``dapo/refilled_groups``; the loop warns).
"""

from __future__ import annotations

import numpy as np

from rlctl.algorithms.dapo import dynamic_sampling_values
from rlctl.dispatch import DataProto
from rlctl.trainer.step.stages import groups_with_signal


class GroupRounds:
    """The groups kept (and dropped) over one step's rounds, for ``need`` rows of ``n`` per group."""

    def __init__(self, algo, need: int, n: int) -> None:
        self.metric, self.max_rounds = algo.dynamic_sampling_metric, algo.max_sampling_rounds
        self.need, self.n = need, n
        self.kept: list[DataProto] = []
        self.dropped: list[DataProto] = []
        self.rounds = 0

    @property
    def have(self) -> int:
        """Rows of groups with signal so far."""
        return sum(len(b) for b in self.kept)

    @property
    def refilled(self) -> int:
        """Groups without signal the batch is filled up with."""
        return max(0, self.need - self.have) // self.n

    def add(self, batch: DataProto) -> bool:
        """One round's scored batch; whether the step has its batch (full, or out of rounds)."""
        self.rounds += 1
        keep = groups_with_signal(dynamic_sampling_values(batch.batch, self.metric), batch.non_tensor["uid"])
        self.kept.append(batch[np.flatnonzero(keep)])
        self.dropped.append(batch[np.flatnonzero(~keep)])
        return self.have >= self.need or self.rounds >= self.max_rounds

    def batch(self) -> DataProto:
        """``need`` rows: the kept groups first, then dropped ones as refill."""
        return DataProto.concat([b for b in self.kept + self.dropped if len(b)])[: self.need]

    def refill_report(self) -> dict:
        """What the loop's warning says when the rounds ran out before the batch was full."""
        return {
            "refilled_groups": self.refilled,
            "groups": self.need // self.n,
            "rounds": self.rounds,
            "metric": self.metric,
            "hint": "raise algorithm.max_sampling_rounds, or the data is too easy/hard for the policy",
        }

    def metrics(self) -> dict[str, float]:
        have, need = self.have, self.need
        return {
            "dapo/rounds": float(self.rounds),
            "dapo/kept_groups": float(min(have, need) // self.n),
            "dapo/refilled_groups": float(self.refilled),
            "dapo/kept_fraction": min(1.0, have / need),
        }
