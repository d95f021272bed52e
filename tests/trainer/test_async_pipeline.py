"""The rollout thread's staleness bound, over seeds, bounds and thread timings (no real model)."""

from __future__ import annotations

import random
import threading
import time

import pytest

from rlctl.trainer.loops.pipeline import Produced, RolloutPipeline


def drive(
    seed: int, max_staleness: int, exact: bool, steps: int, first: int = 1, chain: bool = False, pushed=None
) -> list[tuple[int, int, int]]:
    """Run a fake trainer against the pipeline with random delays on both sides; returns, per
    generated batch, (index, version it was generated with, newest published version then)."""
    rng = random.Random(seed)
    delays = [rng.choice((0.0, 0.0005, 0.002)) for _ in range(4 * steps)]
    loaded: list[int] = [] if pushed is None else pushed
    seen: list[tuple[int, int, int]] = []
    newest = [first]
    lock = threading.Lock()

    def produce(index: int, version: int) -> Produced:
        with lock:
            seen.append((index, version, newest[0]))
        assert loaded[-1] == version  # the workers hold the weights the batch reports
        time.sleep(delays[index])
        return Produced(index, batch=None, version=version)

    def push(version: int, weights) -> None:
        assert weights == f"w{version}"
        loaded.append(version)

    pipe = RolloutPipeline(
        produce,
        push,
        first=first,
        last=first + steps - 1,
        version=first,
        weights=f"w{first}",
        max_staleness=max_staleness,
        exact=exact,
        chain=chain,
    ).start()
    try:
        for step in range(first, first + steps):
            item, _ = pipe.next(step)
            assert step - item.version <= max_staleness
            time.sleep(delays[2 * steps + step - first])
            with lock:
                newest[0] = step + 1
            pipe.publish(step + 1, f"w{step + 1}")
    finally:
        pipe.close()
    return seen


@pytest.mark.parametrize("exact", [False, True])
@pytest.mark.parametrize("max_staleness", [0, 1, 2, 3])
@pytest.mark.parametrize("seed", range(6))
def test_staleness_never_exceeds_the_bound(seed, max_staleness, exact):
    steps = 8
    seen = drive(seed, max_staleness, exact, steps, first=1 + seed % 3)  # also a resumed start
    first = 1 + seed % 3
    assert [i for i, _, _ in seen] == list(range(first, first + steps))
    for index, version, newest in seen:
        assert index - version <= max_staleness  # the bound, per batch, before it is trained
        assert version <= newest  # never weights the trainer has not published
        if exact:  # one fixed version per batch, whatever the timing
            assert version == max(first, index - max_staleness)


def test_one_step_off_schedule_is_one_behind():
    seen = drive(0, 1, True, 5)
    assert [(i, v) for i, v, _ in seen] == [(1, 1), (2, 1), (3, 2), (4, 3), (5, 4)]


def test_a_rollout_failure_reaches_the_trainer():
    def produce(index: int, version: int) -> Produced:
        raise RuntimeError("generation broke")

    pipe = RolloutPipeline(
        produce, lambda v, w: None, first=1, last=3, version=1, weights=None, max_staleness=1, exact=False
    ).start()
    with pytest.raises(RuntimeError, match="generation broke"):
        pipe.next(1)
    pipe.close()


def test_ready_batches_come_first_and_peek_does_not_consume():
    """A resumed one_step_off run: batch 4 came from the checkpoint (version 3); 5 on uses 4 on."""
    made: list[tuple[int, int]] = []

    def produce(index: int, version: int) -> Produced:
        made.append((index, version))
        return Produced(index, batch=None, version=version)

    restored = Produced(4, batch=None, version=3)
    pipe = RolloutPipeline(
        produce,
        lambda v, w: None,
        first=5,
        last=6,
        version=4,
        weights="w4",
        max_staleness=1,
        exact=True,
        ready=[restored],
    ).start()
    try:
        assert pipe.peek(4) is restored and pipe.peek(4) is restored
        assert pipe.next(4)[0] is restored
        pipe.publish(5, "w5")
        assert pipe.next(5)[0].version == 4
        with pytest.raises(Exception, match="expected batch 7, got 6"):
            pipe.peek(7)
    finally:
        pipe.close()
    assert made == [(5, 4), (6, 5)]


@pytest.mark.parametrize("seed", range(6))
def test_chain_pushes_every_version_in_order_within_the_bound(seed):
    """Delta pushes: each version is the change from the one before, so the workers are pushed
    every published version, in order, none skipped, and staleness stays within the bound."""
    pushed: list[int] = []
    seen = drive(seed, max_staleness=2, exact=False, steps=12, chain=True, pushed=pushed)
    assert pushed == list(range(1, pushed[-1] + 1))
    assert all(index - version <= 2 for index, version, _ in seen)
