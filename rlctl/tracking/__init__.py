"""Experiment tracking: one ``Tracker`` fans each step's metrics out to the chosen backends.

Backends: ``jsonl`` (``RUN_DIR/metrics.jsonl``, the file ``rlctl report`` reads), ``console``
(progress bar on a terminal, log lines otherwise), ``tensorboard`` and ``wandb`` (when installed).
"""

from __future__ import annotations

from rlctl.tracking.tracker import VALID_LOGGERS, Tracker

__all__ = ["VALID_LOGGERS", "Tracker"]
