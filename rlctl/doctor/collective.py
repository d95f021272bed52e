"""One rank of doctor's collective smoke test: ``python -m rlctl.doctor.collective``.

Reads RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT and RLCTL_DOCTOR_DEVICE (the platform's
``RuntimeSpec`` as JSON) from the environment, all-reduces ``rank + 1`` on the platform's backend
through its runtime half (:mod:`rlctl.devices`) and prints one JSON line with the result.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta


def main() -> dict:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    import torch
    import torch.distributed as dist

    from rlctl.devices import DeviceRuntime
    from rlctl.platforms.runtime_spec import RuntimeSpec

    torch.set_num_threads(1)
    runtime = DeviceRuntime(RuntimeSpec.from_json(os.environ["RLCTL_DOCTOR_DEVICE"]))
    device = runtime.device(rank)
    runtime.set_device(rank)
    dist.init_process_group(runtime.dist_backend, rank=rank, world_size=world, timeout=timedelta(seconds=60))
    try:
        t = torch.tensor([float(rank + 1)], device=device)
        dist.all_reduce(t)
        got, want = float(t.item()), world * (world + 1) / 2
    finally:
        dist.destroy_process_group()
    return {"ok": got == want, "rank": rank, "got": got, "want": want}


if __name__ == "__main__":  # pragma: no cover - run as a child process by rlctl.doctor.deep
    try:
        out = main()
    except BaseException as exc:  # noqa: BLE001 - the parent wants JSON, not a traceback
        out = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    sys.stdout.write(json.dumps(out) + "\n")
