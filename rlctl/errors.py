"""Error types that decide how rlctl exits.

UserError: bad input (profile, flag, file). The CLI prints its one-line message and exits 2.
RunError: a runtime failure (a worker died, a step failed). The CLI prints it and exits 1.
Stopped: a run stopped by a signal (after saving where it could); exits 128 + the signal.
NotBuiltError: a command that exists in the CLI but is not implemented; exits 1, says so.
"""

from __future__ import annotations


class RlctlError(Exception):
    """Base of rlctl's own errors; ``exit_code`` is what the CLI returns."""

    exit_code = 1


class UserError(RlctlError):
    """Bad input from the user: one line, names the file/key/value and what was expected."""

    exit_code = 2


class CheckpointRefused(UserError):
    """A checkpoint that must not be loaded: it holds more than data, or its files differ from
    what its save recorded. Never skipped in favour of an older one: the user decides."""


class RunError(RlctlError):
    """A failure at run time: says which role, rank and step failed when known."""

    exit_code = 1


class DiskFullError(RunError):
    """A save that found no space left on device: names the path, the space needed and free."""


class NotBuiltError(RlctlError):
    """A command or feature that is not implemented yet; it must not pretend."""

    exit_code = 1


class Stopped(RlctlError):
    """A run stopped on request (SIGINT/SIGTERM/SIGUSR1); ``exit_code`` is 128 + the signal."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code
