"""Stopping a run without losing it: Ctrl-C, SIGTERM (a scheduler's stop) and SIGUSR1 (SLURM's
warning before preemption) all finish the current step, save a checkpoint and exit 128 + signal.

A second signal aborts at once (Ctrl-C: exit 130; SIGTERM/SIGUSR1: 128 + signal) with the latest
checkpoint kept. ``trainer.stop_grace_s`` bounds the wait: a step still running that long after
the first signal is abandoned the same way (a half-done step cannot be saved; the checkpoint
before it is the run's state, and ``--resume auto`` continues from it).
"""

from __future__ import annotations

import _thread
import signal
import threading
from types import TracebackType

from rlctl.errors import Stopped
from rlctl.log import get_logger

log = get_logger("rlctl.trainer")

STOP_SIGNALS = tuple(
    s for s in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGUSR1", None)) if s is not None
)


class StopSignals:
    """While active (main thread only), the first stop signal sets ``requested`` to its number."""

    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        self.requested: int | None = None
        self.expired = False
        self._previous: dict[int, object] = {}
        self._timer: threading.Timer | None = None

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for signum in STOP_SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._timer is not None:
            self._timer.cancel()
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def stopped(self, step: int) -> Stopped:
        """The exception that ends the run after the checkpoint of ``step`` was saved."""
        name = signal.Signals(self.requested).name
        return Stopped(f"stopped by {name} after saving the checkpoint of step {step}", 128 + self.requested)

    def _handle(self, signum: int, frame: object) -> None:
        name = signal.Signals(signum).name
        if self.expired:
            raise Stopped(
                f"the step did not finish within trainer.stop_grace_s = {self.grace_s:g} s after "
                f"{signal.Signals(self.requested).name}; the latest checkpoint is kept (--resume auto)",
                128 + self.requested,
            )
        if self.requested is not None:
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            raise Stopped(
                f"aborted by a second {name}; the latest checkpoint is kept (--resume auto)", 128 + signum
            )
        self.requested = signum
        log.warning(f"{name}: finishing this step, saving a checkpoint, then stopping (again to abort)")
        if self.grace_s > 0:
            self._timer = threading.Timer(self.grace_s, self._expire)
            self._timer.daemon = True
            self._timer.start()

    def _expire(self) -> None:
        self.expired = True
        _thread.interrupt_main(signal.SIGINT)  # runs ``_handle`` in the main thread
