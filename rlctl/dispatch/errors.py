"""Errors raised on the driver when a worker-group call fails."""

from __future__ import annotations

from rlctl.errors import RunError


class WorkerError(RunError):
    """A call on a worker group failed on some rank.

    ``role``, ``method`` and ``rank`` say where; ``remote_traceback`` is the worker's formatted
    traceback (empty when the process died). ``step`` is for the driver to fill in (``with_step``)
    so the final message names the training step too.
    """

    def __init__(
        self,
        role: str,
        method: str,
        rank: int | None,
        reason: str,
        remote_traceback: str = "",
        step: int | None = None,
    ) -> None:
        self.role, self.method, self.rank = role, method, rank
        self.reason, self.remote_traceback, self.step = reason, remote_traceback, step
        super().__init__(self._message())

    def _message(self) -> str:
        where = f"role={self.role} method={self.method}"
        if self.rank is not None:
            where += f" rank={self.rank}"
        if self.step is not None:
            where = f"step={self.step} " + where
        msg = f"worker call failed ({where}): {self.reason}"
        if self.remote_traceback:
            msg += "\n--- remote traceback ---\n" + self.remote_traceback.rstrip()
        return msg

    def with_step(self, step: int) -> WorkerError:
        """A copy of this error that also names the driver's step."""
        return type(self)(self.role, self.method, self.rank, self.reason, self.remote_traceback, step)

    def __reduce__(self):  # picklable across Ray
        return (
            type(self),
            (self.role, self.method, self.rank, self.reason, self.remote_traceback, self.step),
        )


class WorkerDiedError(WorkerError):
    """The worker process of a rank died (killed, OOM, segfault) during or before the call."""


class CallTimeoutError(WorkerError):
    """A call did not finish within its ``timeout``."""
