"""Scorer worker processes: a sample that runs past its time limit is killed with its process.

Each worker is a process of its own that loads the scorer once, then scores one sample per
request. When a sample runs past ``timeout_s`` the pool kills that worker's process group and
starts a fresh worker, so nothing keeps running after a timeout (a thread cannot be killed; a
process can). A worker that dies (segfault, ``os._exit``, OOM kill) scores its sample as an
error and is replaced the same way. With ``data_limit_mb``, each worker's heap (RLIMIT_DATA) is
bounded once its scorer is loaded: a sample whose parse needs more fails with MemoryError. A
sample that goes past a bound (``rlctl.rewards.limits.LIMIT_ERRORS``) ends ``limit``, not
``error``: it is the response's doing.

Workers are forked from multiprocessing's fork server (one single-threaded process started
once, with this module and its imports preloaded), so a new worker costs milliseconds and
never inherits the driver's threads, CUDA state or locks.
"""

from __future__ import annotations

import contextlib
import importlib.util
import multiprocessing as mp
import os
import resource
import signal
import time
import traceback
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

from rlctl.errors import RunError
from rlctl.rewards.limits import LIMIT_ERRORS

LOAD_TIMEOUT_S = 120.0  # a worker loading the scorer (importing the user's file) that long is broken


@dataclass(frozen=True)
class Outcome:
    """One sample's result: status ok | error | timeout | limit; value (ok), reason and traceback (error)."""

    status: str
    value: Any = None
    reason: str = ""
    traceback: str = ""


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _worker_main(
    conn: Connection, loader: Callable[[], Callable[..., Any]], data_limit_mb: int | None = None
) -> None:
    """A worker: load the scorer, say ready, then answer (args) -> Outcome until told to stop."""
    with contextlib.suppress(OSError):
        os.setpgrp()  # its own process group, so a kill also ends what the scorer started
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C belongs to the driver
    try:
        fn = loader()
    except BaseException as exc:
        conn.send(Outcome("error", reason=describe(exc), traceback=traceback.format_exc()))
        return
    if data_limit_mb is not None:
        limit = data_limit_mb << 20
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    conn.send(Outcome("ok", "ready"))
    while True:
        try:
            args = conn.recv()
        except (EOFError, OSError):  # the driver is gone
            return
        if args is None:
            return
        try:
            out = Outcome("ok", fn(*args))
        except LIMIT_ERRORS as exc:  # the response made the parse too costly: it scores 0, counted
            out = Outcome("limit", reason=describe(exc))
        except BaseException as exc:  # SystemExit from user code is an error of that sample too
            out = Outcome("error", reason=describe(exc), traceback=traceback.format_exc())
        try:
            conn.send(out)
        except Exception as exc:  # a result that cannot be pickled
            conn.send(Outcome("error", reason=f"result not picklable: {describe(exc)}"))


def _context() -> mp.context.BaseContext:
    ctx = mp.get_context("forkserver")
    preload = ["rlctl.rewards.pool"]
    if importlib.util.find_spec("math_verify") is not None:
        preload.append("math_verify")
    ctx.set_forkserver_preload(preload)  # takes effect if the fork server is not running yet
    return ctx


class _Worker:
    def __init__(
        self,
        ctx: mp.context.BaseContext,
        loader: Callable[[], Callable[..., Any]],
        name: str,
        data_limit_mb: int | None = None,
    ):
        parent, child = ctx.Pipe(duplex=True)
        self.proc = ctx.Process(
            target=_worker_main, args=(child, loader, data_limit_mb), daemon=True, name=name
        )
        self.proc.start()
        child.close()
        self.conn: Connection = parent
        if not parent.poll(LOAD_TIMEOUT_S):
            self.kill()
            raise RunError(f"{name}: the scorer did not load within {LOAD_TIMEOUT_S:.0f} s")
        try:
            first: Outcome = parent.recv()
        except (EOFError, OSError):
            self.kill()
            raise RunError(f"{name}: the scorer process died while loading") from None
        if first.status != "ok":
            self.kill()
            raise RunError(f"{name}: the scorer failed to load: {first.reason}\n{first.traceback}".rstrip())

    @property
    def pid(self) -> int:
        assert self.proc.pid is not None
        return self.proc.pid

    def kill(self) -> None:
        """Kill the worker's process group (the worker and what it started), then reap it."""
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except OSError:  # not yet its own group leader, or already gone
            self.proc.kill()
        self.proc.join(10)
        self.conn.close()

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            self.conn.send(None)
        self.proc.join(2)
        if self.proc.is_alive():
            self.kill()
        else:
            self.conn.close()


class ScorerPool:
    """Up to ``workers`` scorer processes, started on first use and kept between batches."""

    def __init__(
        self,
        loader: Callable[[], Callable[..., Any]],
        workers: int,
        timeout_s: float | None,
        name: str,
        data_limit_mb: int | None = None,
    ) -> None:
        self.loader, self.size, self.timeout_s, self.name = loader, max(1, workers), timeout_s, name
        self.data_limit_mb = data_limit_mb
        self._ctx = _context()
        self._idle: list[_Worker] = []
        self.started_pids: list[int] = []  # every worker ever started (for tests and post-mortems)

    def live_pids(self) -> list[int]:
        return [w.pid for w in self._idle if w.proc.is_alive()]

    def _take(self) -> _Worker:
        while self._idle:
            w = self._idle.pop()
            if w.proc.is_alive():
                return w
            w.kill()
        w = _Worker(self._ctx, self.loader, f"rlctl-reward[{self.name}]", self.data_limit_mb)
        self.started_pids.append(w.pid)
        return w

    def run(self, calls: Sequence[tuple[Any, ...]]) -> list[Outcome]:
        """Score every argument tuple; each ends ok, error (with traceback) or timeout."""
        results: list[Outcome | None] = [None] * len(calls)
        todo = deque(range(len(calls)))
        busy: dict[Connection, tuple[_Worker, int, float]] = {}
        try:
            while todo or busy:
                while todo and len(busy) < self.size:
                    i = todo.popleft()
                    w = self._take()
                    try:
                        w.conn.send(calls[i])
                    except Exception as exc:  # unpicklable input or a dead pipe: that sample errs
                        results[i] = Outcome("error", reason=f"cannot send the sample: {describe(exc)}")
                        w.kill()
                        continue
                    deadline = time.monotonic() + self.timeout_s if self.timeout_s is not None else 0.0
                    busy[w.conn] = (w, i, deadline)
                if not busy:
                    continue
                wait_s = None
                if self.timeout_s is not None:
                    wait_s = max(0.0, min(d for _, _, d in busy.values()) - time.monotonic())
                for conn in wait(list(busy), timeout=wait_s):
                    w, i, _ = busy.pop(conn)  # type: ignore[arg-type]
                    try:
                        results[i] = conn.recv()  # type: ignore[union-attr]
                        self._idle.append(w)
                    except (EOFError, OSError):
                        w.proc.join(5)
                        results[i] = Outcome(
                            "error", reason=f"scorer process died (exit code {w.proc.exitcode})"
                        )
                        w.kill()
                now = time.monotonic()
                for conn, (w, i, deadline) in list(busy.items()):
                    if self.timeout_s is not None and now >= deadline:
                        del busy[conn]
                        w.kill()
                        results[i] = Outcome("timeout")
        finally:
            for w, _, _ in busy.values():  # interrupted mid-batch: leave nothing running
                w.kill()
        return [r if r is not None else Outcome("error", reason="not scored") for r in results]

    def close(self) -> None:
        while self._idle:
            self._idle.pop().stop()
