"""Failures speak: a raising rank, a SIGKILLed worker process and a timeout each give a clear error."""

from __future__ import annotations

import os
import signal
import time

import pytest

from rlctl.dispatch import CallTimeoutError, ResourcePool, WorkerDiedError, WorkerError, WorkerGroup
from tests.dispatch.workers import BadInitWorker, EchoWorker

pytestmark = [pytest.mark.ray, pytest.mark.timeout(180)]
ENV = {"OMP_NUM_THREADS": "1"}


@pytest.fixture
def pair(ray_session):
    pool = ResourcePool(1, 2, name="failures")
    wg = WorkerGroup(pool, EchoWorker, env=ENV)
    yield wg
    wg.shutdown()
    pool.release()


def test_exception_on_one_rank_names_role_method_rank_and_traceback(pair):
    with pytest.raises(WorkerError) as info:
        pair.fail_on(1, timeout=30)
    err = info.value
    assert (err.role, err.method, err.rank) == ("actor", "fail_on", 1)
    assert "ValueError: boom on rank 1" in str(err)
    assert 'workers.py", line' in err.remote_traceback
    # the group still works after a method raised
    assert pair.add([1, 1], [1, 1]) == [2, 3]


def test_sigkilled_worker_is_reported_not_hung(pair):
    pid = pair.whoami()[1]["pid"]
    fut = pair.sleep(120.0, blocking=False)
    time.sleep(0.5)
    os.kill(pid, signal.SIGKILL)
    # timeout=30 turns a hang into CallTimeoutError, which would fail this test
    with pytest.raises(WorkerDiedError) as info:
        fut.get(timeout=30)
    assert info.value.rank == 1 and info.value.method == "sleep"
    assert "died" in str(info.value)
    with pytest.raises(WorkerError):
        pair.whoami(timeout=30)  # later calls fail fast too


def test_call_timeout(pair):
    with pytest.raises(CallTimeoutError, match=r"no result within 0.5s from ranks \[0, 1\]"):
        pair.sleep(20.0, timeout=0.5)


def test_init_failure_names_the_rank(ray_session):
    pool = ResourcePool(1, 2, name="badinit")
    try:
        with pytest.raises(WorkerError, match=r"method=__init__ rank=1\).*cannot load model on rank 1"):
            WorkerGroup(pool, BadInitWorker, env=ENV, init_timeout=60)
    finally:
        pool.release()
