"""rlctl's local Ray cluster listens on loopback only and requires Ray's token.

Before ``bind_loopback`` a plain local ``ray.init()`` had gcs_server, raylet, the driver and the
workers listening on ``*`` (every interface) as ``ss -ltn`` showed during ``rlctl train``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from rlctl.dispatch.ray_network import _decode, off_loopback, token_auth

pytest.importorskip("ray")

SCRIPT = r"""
import json, os, subprocess, shutil
from rlctl.dispatch.backend_ray import connect
from rlctl.dispatch.ray_network import listening_addresses, process_tree
import ray

connect("local", num_cpus=1, log_to_driver=False)

@ray.remote
def f():
    return os.getpid()

ray.get(f.remote())  # a worker process is up and listening too
tree = set(process_tree(os.getpid()))
ss = []
if shutil.which("ss"):
    for line in subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True).stdout.splitlines():
        pids = {int(p.split("=")[1]) for p in line.replace(",", " ").split() if p.startswith("pid=")}
        if pids & tree:
            ss.append(line.split()[3])
print(json.dumps({"proc": listening_addresses(), "ss": ss, "tree": len(tree)}))
ray.shutdown()
"""


@pytest.mark.timeout(120)
def test_local_cluster_listens_on_loopback_only():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=110)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["tree"] >= 3 and len(got["proc"]) >= 4  # gcs_server, raylet, driver, worker
    assert off_loopback(got["proc"]) == [], got["proc"]
    if shutil.which("ss"):
        assert got["ss"] and all(a.startswith(("127.", "[::ffff:127.", "[::1]")) for a in got["ss"]), got["ss"]


def test_token_auth_needs_ray_2_59_and_no_opt_out():
    assert token_auth("2.58.1", {}) == (False, "Ray 2.58.1 has no token auth by default (needs >= 2.59)")
    assert token_auth("2.60.0", {"RAY_AUTH_MODE": "disabled"})[0] is False
    assert token_auth("2.60.0", {}) == (True, "token auth on (Ray 2.60.0)")
    assert token_auth("3.0.0", {"RAY_AUTH_MODE": "token"})[0] is True


def test_proc_net_addresses_decode_and_loopback_filter():
    assert _decode("0100007F") == "127.0.0.1"
    assert _decode("0000000000000000FFFF00000100007F") == "127.0.0.1"  # v4-mapped, as Ray binds
    assert _decode("00000000000000000000000001000000") == "::1"
    assert _decode("00000000000000000000000000000000") == "::"
    assert off_loopback(["127.0.0.1:1", "::1:2", "0.0.0.0:3", ":::4", "192.0.2.2:5"]) == [
        "0.0.0.0:3",
        ":::4",
        "192.0.2.2:5",
    ]


@pytest.mark.parametrize(("ray", "env", "verdict"), [("2.60.0", {}, "PASS"), ("2.58.0", {}, "WARN"),
                                                     ("2.60.0", {"RAY_AUTH_MODE": "disabled"}, "WARN")])  # fmt: skip
def test_doctor_says_who_can_reach_the_cluster(tmp_path, ray, env, verdict):
    from rlctl.doctor.checks_host import check_ray_network
    from rlctl.platforms import resolve_platform
    from tests.platforms.fakes import cpu_host, make_dist

    host = cpu_host(tmp_path, env=env)
    make_dist(tmp_path / "site", "ray", ray)  # replaces the stack's 2.60.0 dist-info
    if ray != "2.60.0":
        shutil.rmtree(tmp_path / "site" / "ray-2.60.0.dist-info")
    (row,) = check_ray_network(resolve_platform("cpu", env=env, host=host))
    assert row.verdict.value == verdict and "127.0.0.1 only" in row.reason
    if verdict == "WARN":
        assert "any local user can run code" in row.reason
