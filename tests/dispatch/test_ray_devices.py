"""Device selection under Ray: which device each worker runs on, with Ray narrowing visibility
(its default) and with the pool asking it not to (``ResourcePool.node_devices``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlctl.dispatch.ray_devices import device_index, noset_env, visible_ids
from rlctl.errors import UserError
from rlctl.platforms.runtime_spec import CPU_RUNTIME, RuntimeSpec

ROOT = Path(__file__).resolve().parents[2]
UUIDS = "GPU-aa11,GPU-bb22,GPU-cc33"


def test_visible_ids_read_as_rays_managers_do():
    assert visible_ids(None) is None  # unset: every device
    assert visible_ids("") == [] and visible_ids("NoDevFiles") == []
    assert visible_ids("6,3,1") == ["6", "3", "1"]


@pytest.mark.parametrize(
    ("assigned", "visible", "index"),
    [
        (["5"], "5", 0),  # Ray narrowed visibility to the worker's own device
        (["5"], None, 5),  # the node's list unset: the id is the device number
        (["1"], "6,3,1,0", 2),  # the node started on a subset: the id's place in it, not the id
        (["GPU-cc33"], UUIDS, 2),  # a node that names its devices by UUID
        (["4"], "6,3,1,0", None),  # an id the worker does not see
        (["1", "3"], "6,3,1,0", None),  # not one device
        ([], None, None),
    ],
)
def test_device_index_is_the_assigned_ids_place_among_the_visible(assigned, visible, index):
    assert device_index(assigned, visible) == index


def test_noset_env_is_the_platforms_own_variable():
    spec = RuntimeSpec("cuda", "nccl", "GPU", "HIP_VISIBLE_DEVICES", None, "RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES")
    assert noset_env(spec, "pool") == {"RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES": "1"}
    assert noset_env(CPU_RUNTIME, "pool") == {}  # nothing to narrow
    no_switch = RuntimeSpec("ve", "gloo", "VE", "VE_VISIBLE_DEVICES", None, None)
    with pytest.raises(UserError, match=r"^pool: each rank must see its node's ve devices, and Ray has no"):
        noset_env(no_switch, "pool")


@pytest.mark.ray
@pytest.mark.timeout(240)
def test_ray_pool_leaves_node_devices_visible_and_each_rank_on_its_assigned_one():
    env = dict(os.environ, PYTHONPATH=str(ROOT), RAY_DEDUP_LOGS="0")
    for name in ("RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES", "RAY_ADDRESS"):
        env.pop(name, None)
    proc = subprocess.run(
        [sys.executable, "-m", "tests.dispatch.ray_devices_script"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=220,
    )  # fmt: skip
    lines = [json.loads(ln[len("RESULT ") :]) for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and len(lines) == 2, proc.stdout[-2000:] + proc.stderr[-4000:]
    narrowed, shared = (run["ranks"] for run in lines)
    node = ["6", "3", "1", "0"]
    # Ray's default: each worker sees only the id it was assigned, and runs on its device 0
    assert sorted(r["assigned"][0] for r in narrowed) == sorted(node)
    assert all(r["visible"] == r["assigned"][0] and r["device"] == "cuda:0" for r in narrowed), narrowed
    # node_devices: every worker sees the node's devices and runs on the one Ray assigned it
    assert all(r["visible"] == "6,3,1,0" for r in shared), shared
    assert sorted(r["assigned"][0] for r in shared) == sorted(node)
    assert [r["device"] for r in shared] == [f"cuda:{node.index(r['assigned'][0])}" for r in shared]
    assert sorted(r["device"] for r in shared) == [f"cuda:{i}" for i in range(4)]


def test_a_worker_that_sees_the_node_must_find_its_assigned_device(monkeypatch):
    """With the node's devices visible, device 0 would be every rank's: an assigned id the worker
    cannot place is a RunError naming the rank (under Ray's narrowing it stays the first device)."""
    import ray

    from rlctl.dispatch.ray_devices import own_device
    from rlctl.errors import RunError

    spec = RuntimeSpec("cuda", "nccl", "GPU", "CUDA_VISIBLE_DEVICES", None, "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES")
    context = type("Context", (), {"get_accelerator_ids": lambda self: {"GPU": ["4"], "NPU": []}})()
    monkeypatch.setattr(ray, "get_runtime_context", lambda: context)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "6,3,1,0")
    with pytest.raises(RunError, match=r"^rank 2: Ray assigned GPU \['4'\], which is not one device among those it sees \(CUDA_VISIBLE_DEVICES=6,3,1,0\)$"):
        own_device(spec, 2, required=True)
    assert own_device(spec, 2, required=False) is None
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "6,3,4,0")
    assert own_device(spec, 2, required=True) == 2
    assert own_device(CPU_RUNTIME, 2, required=True) is None  # no device to pick
