"""The rollout thread of the off-policy modes: batches produced ahead of the trainer, bounded staleness.

Versions follow the sync loop's convention: the policy that trains step ``s`` is weight version
``s`` (the initial weights are version 1; step ``s``'s update publishes version ``s + 1``), so a
sample generated with version ``v`` and trained at step ``s`` has staleness ``s - v`` (0 in sync).

Batch ``b`` (the one step ``b`` trains) is generated only once a version ``>= b - max_staleness``
is published, so no trained sample is ever staler than the bound; that gate also bounds how far
ahead the thread runs (at most ``max_staleness + 1`` batches). Two ways to pick the weights:

- ``exact`` (one_step_off): batch ``b`` uses exactly version ``max(first, b - max_staleness)``, so
  the run is the same whatever the thread timing (deterministic given a seed).
- latest (async): the newest published version, pushed to the rollout workers before the
  generation starts (an in-flight generation finishes under the weights it started with).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rlctl.errors import RunError


@dataclass
class Produced:
    """One generated, scored batch and what the trainer logs about it."""

    index: int  # the step that trains it
    batch: Any  # DataProto
    version: int  # the weight version it was generated with
    counts: dict[str, float] = field(default_factory=dict)  # the rollout stage's metrics
    seconds: dict[str, float] = field(default_factory=dict)  # gen / reward seconds (overlapped)
    data_state: dict | None = None  # the prompt stream's position after this batch's prompts
    carried: Any = None  # carried partial rollouts: the prompts drawn but in no batch yet (DataProto)


Produce = Callable[[int, int], Produced]  # (batch index, weight version) -> Produced
Push = Callable[[int, Any], None]  # (weight version, weights) -> load them into the rollout workers


class RolloutPipeline:
    """Runs ``produce`` for batches ``first..last`` on a background thread, within the bound."""

    def __init__(
        self,
        produce: Produce,
        push: Push,
        *,
        first: int,
        last: int,
        version: int,
        weights: Any,
        max_staleness: int,
        exact: bool,
        ready: list[Produced] | tuple[Produced, ...] = (),
        chain: bool = False,
    ) -> None:
        """``ready``: batches produced before a resume (``first`` is the one after them). ``chain``:
        every published version is pushed, in order (delta pushes: each is the change from the one
        before), instead of the newest alone."""
        if max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
        self.produce, self.push = produce, push
        self.first, self.last, self.max_staleness, self.exact = first, last, max_staleness, exact
        self.chain = chain
        self.initial = version
        self.published: dict[int, Any] = {version: weights}
        self.loaded: int | None = None  # the version the rollout workers hold
        self._next_required = version  # exact mode keeps every version from this one on
        self.out: queue.Queue[Produced | BaseException] = queue.Queue()
        for item in ready:
            self.out.put(item)
        self.held: Produced | BaseException | None = None  # taken from ``out`` by ``peek``
        self.cond = threading.Condition()
        self.stopped = False
        self.thread = threading.Thread(target=self._run, name="rlctl-rollout", daemon=True)

    # -- trainer side --------------------------------------------------------------------------------
    def start(self) -> RolloutPipeline:
        self.thread.start()
        return self

    def publish(self, version: int, weights: Any) -> None:
        """The trainer's new weights (``version`` = the step just finished + 1)."""
        with self.cond:
            self.published[version] = weights
            self._forget_unneeded()
            self.cond.notify_all()

    def next(self, step: int) -> tuple[Produced, float]:
        """Batch ``step`` and the seconds the trainer waited for it; a rollout failure re-raises here."""
        start = time.perf_counter()
        item = self.peek(step)
        self.held = None
        return item, time.perf_counter() - start

    def peek(self, step: int) -> Produced:
        """Batch ``step`` (waited for) without taking it: ``next(step)`` still returns it."""
        if self.held is None:
            self.held = self.out.get()
        if isinstance(self.held, BaseException):
            raise self.held
        if self.held.index != step:
            raise RunError(f"rollout pipeline out of order: expected batch {step}, got {self.held.index}")
        return self.held

    def close(self) -> None:
        """Stop after the generation in flight (if any); the thread is joined."""
        with self.cond:
            self.stopped = True
            self.cond.notify_all()
        if self.thread.is_alive() and threading.current_thread() is not self.thread:
            self.thread.join()

    # -- rollout thread ------------------------------------------------------------------------------
    def required(self, index: int) -> int:
        """The oldest version batch ``index`` may be generated with."""
        return max(self.initial, index - self.max_staleness)

    def _forget_unneeded(self) -> None:
        newest = max(self.published)
        floor = newest if not self.exact else min(newest, self._next_required)
        if self.chain and self.loaded is not None:  # the versions not yet pushed stay
            floor = min(floor, self.loaded + 1)
        for v in [v for v in self.published if v < floor]:
            del self.published[v]

    def _wait_for_weights(self, index: int) -> tuple[int, Any] | None:
        need = self.required(index)
        with self.cond:
            self._next_required = need
            while not self.stopped and max(self.published) < need:
                self.cond.wait()
            if self.stopped:
                return None
            version = need if self.exact else max(self.published)
            if self.chain and self.loaded is not None:  # the delta chain up to ``version``
                return version, [(v, self.published[v]) for v in sorted(self.published) if self.loaded < v <= version]
            return version, [(version, self.published[version])]

    def _run(self) -> None:
        try:
            for index in range(self.first, self.last + 1):
                got = self._wait_for_weights(index)
                if got is None:
                    return
                version, pushes = got
                if version != self.loaded:
                    for v, weights in pushes:
                        self.push(v, weights)
                        with self.cond:
                            self.loaded = v
                self.out.put(self.produce(index, version))
        except BaseException as exc:  # handed to the trainer, which raises it in its own thread
            self.out.put(exc)
