"""``trainer.mode = "async"``: batches streamed ahead of the trainer within ``trainer.max_staleness``.

The rollout thread generates batch b as soon as some published version v >= b - max_staleness
exists, with the newest one: weights reach the rollout workers as soon as the trainer has
published them (at the next generation's start; a generation in flight finishes under the
weights it began with). The thread runs at most max_staleness + 1 batches ahead; which version
each batch gets depends on timing, so unlike one_step_off the run is not bit-reproducible. Each
sample's version and staleness are logged (``async/staleness_mean`` / ``_max``) and corrected
(:mod:`rlctl.trainer.loops.off_policy`).
"""

from __future__ import annotations

from rlctl.trainer.loops.off_policy import OffPolicyTrainer


class AsyncTrainer(OffPolicyTrainer):
    """Streaming generation with bounded staleness and the newest weights."""

    exact = False

    def max_staleness(self) -> int:
        return self.p.trainer.max_staleness
