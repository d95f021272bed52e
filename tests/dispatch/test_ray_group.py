"""Worker groups on a local Ray (CPU): collectives, colocation, futures across groups, split pools."""

from __future__ import annotations

import pytest
import torch

from rlctl.dispatch import DataProto, DispatchFuture, ResourcePool, WorkerGroup, spawn_colocated
from tests.dispatch.workers import EchoWorker, FileSignalWorker, RefWorker, RolloutWorker

pytestmark = [pytest.mark.ray, pytest.mark.timeout(180)]
ENV = {"OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def pair(ray_session):
    pool = ResourcePool(1, 2, name="pair")
    wg = WorkerGroup(pool, EchoWorker, mesh={"dp": 2}, env=ENV)
    yield wg
    wg.shutdown()
    pool.release()


def test_two_ranks_all_reduce_over_gloo(pair):
    # rank r contributes 1.0 * (r + 1): 1 + 2
    assert pair.allreduce(1.0) == [3.0, 3.0]
    who = pair.whoami()
    assert [w["rank"] for w in who] == [0, 1] and len({w["pid"] for w in who}) == 2


def test_dp_call_and_futures_chain_without_the_driver(pair):
    x = DataProto.from_dict({"x": torch.arange(5.0)}, {"s": list("abcde")})
    assert pair.double(x)["y"].tolist() == [0.0, 2.0, 4.0, 6.0, 8.0]
    first = pair.double_async(x)
    assert isinstance(first, DispatchFuture)
    second = pair.double_async(first)  # ranks fetch the first call's outputs themselves
    assert second.get()["x"].tolist() == (x["x"] * 4).tolist()
    assert pair.add([1, 2], [3, 4]) == [4, 7] and pair.only_zero(9) == (0, 9)


def test_a_batch_for_one_rank_travels_with_its_call_and_one_for_several_is_put_once(pair, monkeypatch):
    import ray

    puts, real_put = [], ray.put
    monkeypatch.setattr(
        ray, "put", lambda value, **kw: puts.append(type(value).__name__) or real_put(value, **kw)
    )
    x = DataProto.from_dict({"x": torch.arange(6.0)})
    assert pair.double(x)["y"].tolist() == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]  # a shard per rank
    assert puts == []
    assert pair.rows(x) == [6, 6]  # the same batch on both ranks
    assert puts == ["DataProto"]


def test_three_roles_share_one_process_per_device(ray_session):
    pool = ResourcePool(1, 2, name="colo")
    groups = spawn_colocated(
        pool, {"actor": EchoWorker, "rollout": RolloutWorker, "ref": RefWorker}, mesh={"dp": 2}, env=ENV
    )
    try:
        pids = {
            role: [w["pid"] for w in groups["actor"].whoami()] if role == "actor" else wg.pid()
            for role, wg in groups.items()
        }
        assert pids["actor"] == pids["rollout"] == pids["ref"]
        assert len(set(pids["actor"])) == 2
        x = DataProto.from_dict({"x": torch.arange(4.0)})
        gen = groups["rollout"].generate(x, blocking=False)
        ref = groups["ref"].ref_log_prob(gen)
        assert ref["ref"].tolist() == [101.0, 102.0, 103.0, 104.0]
        assert groups["actor"].double(gen.get())["y"].tolist() == [2.0, 4.0, 6.0, 8.0]
    finally:
        for wg in groups.values():
            wg.shutdown()
        pool.release()


def test_groups_on_two_disjoint_pools_run_concurrently(ray_session, tmp_path):
    signal = str(tmp_path / "signal")
    pools = [ResourcePool(1, 1, name="left"), ResourcePool(1, 1, name="right")]
    left = WorkerGroup(pools[0], FileSignalWorker, role="left", env=ENV)
    right = WorkerGroup(pools[1], FileSignalWorker, role="right", env=ENV)
    try:
        waiting = left.wait_for(signal, 60.0, blocking=False)  # returns only once `right` has run
        right.touch(signal)
        assert waiting.get(timeout=90) == [True]
        assert left.host_info[0]["pid"] != right.host_info[0]["pid"]
    finally:
        left.shutdown()
        right.shutdown()
        for p in pools:
            p.release()
