"""``trainer.mode`` -> the rollout source the one loop runs with: each mode whole, in three lines.

    sync          Colocated()                              generate with the current weights, in the step
    one_step_off  Pipeline(exact=True, max_staleness=1)    batch k+1 with the weights before step k's update
    async         Pipeline(exact=False, max_staleness=N)   the newest weights, at most N versions behind

A new mode is a source (``loops/source.py`` says what the loop asks of one), a branch here and
the mode's name in the schema's ``trainer.mode`` choices.
"""

from __future__ import annotations

from typing import Any

from rlctl.trainer.loops.colocated import Colocated
from rlctl.trainer.loops.pipelined import Pipeline
from rlctl.trainer.loops.source import RolloutSource


def rollout_source(ctx: Any) -> RolloutSource:
    """The source for ``ctx.profile.trainer.mode``."""
    mode = ctx.profile.trainer.mode
    if mode == "one_step_off":  # verl's recipe/one_step_off_policy: deterministic given a seed
        return Pipeline(ctx, exact=True, max_staleness=1)
    if mode == "async":  # which version a batch gets depends on timing: not bit-reproducible
        return Pipeline(ctx, exact=False, max_staleness=ctx.profile.trainer.max_staleness)
    return Colocated(ctx)

