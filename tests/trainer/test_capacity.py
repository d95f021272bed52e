"""The capacity guard: a pool the Ray cluster can never place is refused at once, in one line."""

from __future__ import annotations

import pytest

from rlctl.dispatch.capacity import device_hint, require_capacity, shortfall
from rlctl.dispatch.pool import ResourcePool
from rlctl.errors import RunError
from tests.platforms.fakes import make_dist, nvidia_container_host, ray_needing_amdsmi, rocm_host


def node(alive: bool = True, **resources: float) -> dict:
    """One entry of ``ray.nodes()`` (the keys Ray 2.60 returns that the guard reads)."""
    return {"NodeID": "n", "Alive": alive, "Resources": resources}


def test_rocm_host_where_ray_counts_no_gpu():
    pool = ResourcePool(nodes=1, devices_per_node=8, resource="GPU")
    why = shortfall(pool, [node(CPU=192.0, memory=1e12)])  # what Ray reports without amdsmi
    assert why == (
        "Ray sees 0 GPU in the cluster (at most 0 on one node) but the profile needs "
        "1 node(s) x 8 GPU (cluster.nodes x cluster.devices_per_node)"
    )
    with pytest.raises(RunError) as err:
        require_capacity(pool, [node(CPU=192.0)], hint="Ray 2.60 needs amdsmi")
    assert "\n" not in str(err.value) and str(err.value).endswith("; Ray 2.60 needs amdsmi")
    assert err.value.exit_code == 1


def test_enough_devices_pass_and_dead_nodes_do_not_count():
    pool = ResourcePool(nodes=2, devices_per_node=8, resource="NPU", name="actor")
    two = [node(NPU=8.0, CPU=64.0), node(NPU=8.0, CPU=64.0)]
    assert shortfall(pool, two) is None
    why = shortfall(pool, [two[0], node(alive=False, NPU=8.0, CPU=64.0)])
    assert why.startswith("resource pool actor: Ray sees 8 NPU") and "2 node(s) x 8 NPU" in why


def test_devices_split_across_nodes_do_not_make_one_group():
    # 8 GPUs in total but 4 per node: a STRICT_PACK group of 8 never fits
    pool = ResourcePool(nodes=1, devices_per_node=8, resource="GPU")
    assert "at most 4 on one node" in shortfall(pool, [node(GPU=4.0, CPU=32.0), node(GPU=4.0, CPU=32.0)])


def test_cpu_part_of_the_bundle_short():
    pool = ResourcePool(nodes=1, devices_per_node=8, resource="GPU", cpus_per_device=4.0)
    why = shortfall(pool, [node(GPU=8.0, CPU=16.0)])
    assert why == "each node needs 32 CPU for 8 GPU bundles, the largest Ray node has 16 CPU"


def test_hints_name_the_cause_on_this_host(tmp_path):
    host = rocm_host(tmp_path)
    ray_needing_amdsmi(tmp_path / "site")
    assert "amdsmi" in device_hint("GPU", host) and "0 GPUs" in device_hint("GPU", host)
    make_dist(tmp_path / "site", "amdsmi", "7.0.2")
    assert "libamd_smi.so" in device_hint("GPU", rocm_host(tmp_path))
    assert "container" in device_hint("GPU", nvidia_container_host(tmp_path / "c"))
    assert "--num-cpus" in device_hint("CPU", host)


@pytest.mark.timeout(300)
def test_train_refuses_in_one_line_when_ray_has_too_few_devices(write_profile, ray_session, capsys):
    from rlctl.cli.main import main

    profile = write_profile("too-big", backend="ray")
    profile.write_text(
        profile.read_text().replace('backend = "ray"', 'backend = "ray"\ndevices_per_node = 16')
    )
    with pytest.raises(SystemExit) as done:
        main(["train", str(profile)])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("rlctl: error:")]
    assert done.value.code == 1
    assert len(err) == 1 and "Ray sees 8 CPU" in err[0] and "1 node(s) x 16 CPU" in err[0]
