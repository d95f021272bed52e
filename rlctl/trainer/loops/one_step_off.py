"""``trainer.mode = "one_step_off"``: batch k+1 is generated while step k trains.

Schedule (versions as in :mod:`rlctl.trainer.loops.pipeline`: step k trains policy version k)::

    rollout workers:  gen 1 (v1)  gen 2 (v1)   gen 3 (v2)   gen 4 (v3)  ...
    trainer:                      train 1      train 2      train 3     ...

Batch k+1 always uses exactly version k (the weights before step k's update), so each trained
sample lags its policy by one version (batch 1 by none), whatever the thread timing: the run is
deterministic given a seed. verl's recipe/one_step_off_policy is the same schedule.
"""

from __future__ import annotations

from rlctl.trainer.loops.off_policy import OffPolicyTrainer


class OneStepOffTrainer(OffPolicyTrainer):
    """Generation one batch ahead of training, with the weights one update behind."""

    exact = True

    def max_staleness(self) -> int:
        return 1
