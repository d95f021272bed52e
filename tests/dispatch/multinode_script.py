"""Run by test_multinode.py in its own process: a simulated 2-node Ray cluster (ray.cluster_utils).

Each node has room for both placement groups (4 CPUs, 2 needed), so landing on two nodes is the
pool pinning them, not a lack of space.

Prints one JSON line with what landed where. Its own process because Ray allows one cluster
connection per process and the rest of the tests share the session's local Ray.
"""

from __future__ import annotations

import json
import sys

import ray
import torch
from ray.cluster_utils import Cluster

from rlctl.dispatch import DataProto, ResourcePool, WorkerGroup
from tests.dispatch.workers import EchoWorker


def main() -> None:
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 4, "object_store_memory": 80 * 1024 * 1024, "include_dashboard": False},
    )
    cluster.add_node(num_cpus=4, object_store_memory=80 * 1024 * 1024)
    ray.init(address=cluster.address)
    cluster.wait_for_nodes()
    torch.set_num_threads(1)
    result = {"cluster_nodes": sorted(n["NodeID"] for n in ray.nodes() if n["Alive"])}
    runs = []
    for _ in range(2):  # twice: rank order must be the same after a restart on the same cluster
        pool = ResourcePool(nodes=2, devices_per_node=2, resource="CPU", max_groups=1)
        wg = WorkerGroup(pool, EchoWorker, mesh={"dp": 2, "tp": 2}, backend="ray")
        who = wg.whoami()
        out = wg.tag(DataProto({"x": torch.arange(6.0)}))
        runs.append(
            {
                "pg_nodes": pool.node_ids(),
                "local_ranks": [w["local_rank"] for w in who],
                "coords": [w["coords"] for w in who],
                "rank_node": [h["node_id"] for h in wg.host_info],
                "tag_rank": out.batch["rank"].tolist(),
            }
        )
        wg.shutdown()
        pool.release()
    result["runs"] = runs
    print("RESULT " + json.dumps(result))
    ray.shutdown()
    cluster.shutdown()


if __name__ == "__main__":
    sys.exit(main())
