"""TensorBoard and Weights & Biases backends, used only when installed and asked for.

Neither library is a dependency of rlctl. When a profile asks for one that is not installed, the
run goes on without it and says so once (a missing dashboard must not cost a training run).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any

from rlctl.log import get_logger
from rlctl.tracking.base import to_number

_warned: set[str] = set()

INSTALL_HINT = {
    "tensorboard": "pip install tensorboard (or rlctl[tensorboard])",
    "wandb": "pip install wandb (or rlctl[wandb])",
}


def warn_missing(name: str, exc: BaseException) -> None:
    """Warn once per process that backend ``name`` is unavailable, with the install hint."""
    if name in _warned:
        return
    _warned.add(name)
    get_logger("rlctl.tracking").warning(
        f"logger '{name}' asked for but not available; continuing without it",
        reason=str(exc),
        fix=INSTALL_HINT.get(name, ""),
    )


def _numbers(metrics: dict[str, float]) -> dict[str, float]:
    """Finite numeric metrics only (dashboards reject None)."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        if key == "step":
            continue
        number = to_number(key, value)
        if number is not None:
            out[key] = number
    return out


class TensorBoardBackend:
    """Scalars into ``RUN_DIR/tensorboard`` through ``torch.utils.tensorboard.SummaryWriter``.

    On resume, ``purge_step`` hides the events the interrupted run wrote after the checkpoint.
    """

    def __init__(self, run_dir: Path, resume_step: int | None = None) -> None:
        from torch.utils.tensorboard import SummaryWriter  # ImportError when tensorboard is missing

        purge = resume_step + 1 if resume_step is not None else None
        self._writer: Any = SummaryWriter(log_dir=str(Path(run_dir) / "tensorboard"), purge_step=purge)

    def log(self, metrics: dict[str, float], step: int) -> None:
        for key, value in _numbers(metrics).items():
            self._writer.add_scalar(key, value, global_step=step)

    def close(self) -> None:
        self._writer.flush()
        self._writer.close()


class WandbBackend:
    """A wandb run named after the rlctl run; the id lives in ``RUN_DIR/wandb_id`` so a resume continues it.

    The mode (online/offline/disabled), project and entity come from wandb's own environment
    variables (``WANDB_MODE``, ``WANDB_PROJECT``, ``WANDB_ENTITY``); rlctl does not override them.
    """

    def __init__(self, run_dir: Path, run_name: str, config: dict[str, Any], resume: bool) -> None:
        import wandb  # ImportError when wandb is missing

        id_file = Path(run_dir) / "wandb_id"
        run_id = id_file.read_text().strip() if resume and id_file.exists() else secrets.token_hex(4)
        id_file.write_text(run_id + "\n")
        self._run: Any = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "rlctl"),
            name=run_name,
            id=run_id,
            config=config,
            dir=str(run_dir),
            resume="allow",
        )

    def log(self, metrics: dict[str, float], step: int) -> None:
        self._run.log(_numbers(metrics), step=step)

    def close(self) -> None:
        self._run.finish()
