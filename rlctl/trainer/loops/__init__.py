"""The loops: one small loop per ``trainer.mode`` over the same stages (sync, one_step_off, async),
the rollout pipeline the off-policy loops share, and stopping a run without losing it."""
