"""Run untrusted platform code (a plugin's import, factory or probe) with a time limit.

Why: an out-of-tree plugin whose probe sleeps would hang ``rlctl doctor`` and ``rlctl train``,
and one that calls ``sys.exit`` would end them silently. The call runs in a daemon thread; past
the limit it is abandoned (it cannot be killed, but it no longer blocks rlctl or its exit), and a
``SystemExit`` it raises comes back as an ordinary exception.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

T = TypeVar("T")

PROBE_TIMEOUT_S = 30.0  # default limit per probe / plugin load; RLCTL_PROBE_TIMEOUT_S overrides
TIMEOUT_ENV = "RLCTL_PROBE_TIMEOUT_S"


class BoundedCallError(RuntimeError):
    """The call timed out or tried to exit the process."""


def probe_timeout(env: Mapping[str, str]) -> float:
    """The probe time limit: ``RLCTL_PROBE_TIMEOUT_S`` when set to a positive number, else 30 s."""
    try:
        value = float(env.get(TIMEOUT_ENV, ""))
    except ValueError:
        return PROBE_TIMEOUT_S
    return value if value > 0 else PROBE_TIMEOUT_S


def call_bounded(fn: Callable[[], T], timeout: float, what: str) -> T:
    """``fn()`` in a daemon thread; raises ``BoundedCallError`` on timeout or ``SystemExit``,
    re-raises any other exception ``fn`` raised."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - carried to the caller below
            box["error"] = exc

    thread = threading.Thread(target=run, name=f"rlctl-bounded-{what}", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise BoundedCallError(f"{what} did not return within {timeout:g}s (abandoned)")
    err = box.get("error")
    if isinstance(err, SystemExit):
        raise BoundedCallError(f"{what} called sys.exit({err.code!r})")
    if err is not None:
        raise err
    return box["value"]
