"""``trainer.mode`` -> the loop class that runs it (each mode is its own small loop)."""

from __future__ import annotations

from rlctl.profile.schema import Profile


def trainer_class(profile: Profile) -> type:
    """The Trainer subclass for ``profile.trainer.mode`` (sync, one_step_off, async)."""
    mode = profile.trainer.mode
    if mode == "one_step_off":
        from rlctl.trainer.loops.one_step_off import OneStepOffTrainer

        return OneStepOffTrainer
    if mode == "async":
        from rlctl.trainer.loops.asynchronous import AsyncTrainer

        return AsyncTrainer
    from rlctl.trainer.loops.sync import Trainer

    return Trainer
