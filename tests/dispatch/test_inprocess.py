"""The in-process backend runs the same worker code as Ray, in this process, rank by rank."""

from __future__ import annotations

import os

import pytest
import torch

from rlctl.dispatch import (
    CallTimeoutError,
    DataProto,
    ResourcePool,
    WorkerError,
    WorkerGroup,
    spawn_colocated,
)
from rlctl.errors import RunError, UserError
from tests.dispatch.workers import BadInitWorker, EchoWorker, RefWorker, RolloutWorker


def group(world=4, mesh=None, **kw):
    return WorkerGroup(ResourcePool(1, world), EchoWorker, mesh=mesh, backend="inprocess", **kw)


def test_dp_tp_split_collects_one_representative_per_dp_group():
    wg = group(4, {"dp": 2, "tp": 2})
    x = DataProto.from_dict({"x": torch.arange(7.0)})
    out = wg.tag(x)
    assert out["x"].tolist() == x["x"].tolist()
    assert out["rank"].tolist() == [0] * 4 + [2] * 3  # tp_rank 0 of each DP group
    assert out["dp"].tolist() == [0] * 4 + [1] * 3
    assert wg.double(x)["y"].tolist() == (x["x"] * 2).tolist()


def test_worker_knows_rank_mesh_and_device_from_init():
    wg = group(4, {"dp": 2, "tp": 2}, init_kwargs={"scale": 3.0})
    who = wg.whoami()
    assert [w["rank"] for w in who] == [0, 1, 2, 3]
    assert [w["coords"] for w in who][1:3] == [{"dp": 0, "tp": 1}, {"dp": 1, "tp": 0}]
    assert {w["pid"] for w in who} == {os.getpid()} and who[0]["device"] == "cpu"
    assert wg.double(DataProto.from_dict({"x": [1.0]}))["y"].tolist() == [6.0]


def test_other_modes_and_futures():
    wg = group(2)
    assert wg.add([1, 2], [10, 20]) == [11, 23]
    assert wg.only_zero(5) == (0, 5)
    x = DataProto.from_dict({"x": torch.arange(5.0)})
    assert [m["rows"] for m in wg.stats(x)] == [3, 3]  # padded rows are part of the split
    fut = wg.double_async(x)
    assert fut.done()
    assert wg.double_async(fut).get()["x"].tolist() == (x["x"] * 4).tolist()
    assert wg.expand(x, k=3).equals(x.repeat(3))
    assert wg.call("only_zero", 1) == (0, 1)


def test_colocated_roles_share_hosts():
    groups = spawn_colocated(
        ResourcePool(1, 2),
        {"actor": EchoWorker, "rollout": RolloutWorker, "ref": RefWorker},
        backend="inprocess",
    )
    x = DataProto.from_dict({"x": torch.arange(3.0)})
    gen = groups["rollout"].generate(x, blocking=False)
    assert groups["ref"].ref_log_prob(gen)["ref"].tolist() == [101.0, 102.0, 103.0]
    assert groups["actor"]._hosts is groups["ref"]._hosts


def test_errors_name_role_method_rank_and_carry_the_traceback():
    wg = group(3)
    with pytest.raises(WorkerError) as info:
        wg.fail_on(1)
    err = info.value
    assert isinstance(err, RunError)
    assert (err.role, err.method, err.rank) == ("actor", "fail_on", 1)
    assert "boom on rank 1" in str(err) and "workers.py" in err.remote_traceback
    assert "step=12 " in str(err.with_step(12))


def test_init_failure_is_reported_with_its_rank():
    with pytest.raises(WorkerError, match=r"method=__init__ rank=1\).*cannot load model"):
        WorkerGroup(ResourcePool(1, 2), BadInitWorker, backend="inprocess")


def test_timeout_is_checked_after_each_rank():
    wg = group(2)
    with pytest.raises(CallTimeoutError, match="exceeded 0.01s"):
        wg.sleep(0.05, timeout=0.01)


def test_init_distributed_world_one_works_and_many_ranks_refuse_clearly():
    import torch.distributed as dist

    wg = group(2)
    with pytest.raises(WorkerError, match="in-process backend runs all 2 ranks"):
        wg.allreduce(1.0)
    if dist.is_initialized():
        pytest.skip("another test initialised torch.distributed in this process")
    one = group(1)
    try:
        assert one.allreduce(2.0) == [2.0]
    finally:
        dist.destroy_process_group()


def test_bad_inputs_are_user_errors():
    with pytest.raises(UserError, match="has 4 ranks but the resource pool has 2"):
        group(2, {"dp": 2, "tp": 2})
    with pytest.raises(UserError, match="not one of"):
        WorkerGroup(ResourcePool(1, 1), EchoWorker, backend="mpi")
    wg = group(1)
    wg.shutdown()
    with pytest.raises(UserError, match="shut down"):
        wg.whoami()
