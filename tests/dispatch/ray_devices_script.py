"""Run by test_ray_devices.py in its own process: a local Ray cluster that believes it has four GPUs
(``num_gpus=4``, ``CUDA_VISIBLE_DEVICES=6,3,1,0`` as a node started on a subset would have), so Ray's
own accelerator code assigns ids and sets (or, asked not to, leaves) each worker's visibility.

Prints one JSON line per pool: for each rank the ids Ray assigned it (``ray.get_gpu_ids()``), its
``CUDA_VISIBLE_DEVICES`` and the torch device its Worker runs on. No GPU is touched.
"""

from __future__ import annotations

import json
import os
import sys

import ray

from rlctl.dispatch import ResourcePool, WorkerGroup
from rlctl.platforms.runtime_spec import RuntimeSpec
from tests.dispatch.workers import EchoWorker

NODE_DEVICES = "6,3,1,0"
CUDA = RuntimeSpec("cuda", "nccl", "GPU", "CUDA_VISIBLE_DEVICES", None, "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES")


def main() -> None:
    os.environ["CUDA_VISIBLE_DEVICES"] = NODE_DEVICES  # what the raylet, and so every worker, starts with
    ray.init(num_cpus=4, num_gpus=4, object_store_memory=80 * 1024 * 1024, include_dashboard=False)
    for node_devices in (False, True):
        pool = ResourcePool(1, 4, "GPU", cpus_per_device=0.5, runtime=CUDA, node_devices=node_devices)  # GPU shares, as the trainer's
        wg = WorkerGroup(pool, EchoWorker, backend="ray")
        who = wg.whoami()
        assigned = ray.get([h.__ray_call__.remote(lambda _self: ray.get_gpu_ids()) for h in wg._hosts.handles])
        ranks = [
            {"assigned": [str(i) for i in ids], "visible": info["visible_devices"], "device": w["device"]}
            for ids, info, w in zip(assigned, wg.host_info, who, strict=True)
        ]
        print("RESULT " + json.dumps({"node_devices": node_devices, "ranks": ranks}), flush=True)
        wg.shutdown()
        pool.release()
    ray.shutdown()


if __name__ == "__main__":
    sys.exit(main())
