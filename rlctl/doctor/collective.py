"""One rank of doctor's collective smoke test: ``python -m rlctl.doctor.collective``.

Reads RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, RLCTL_DOCTOR_BACKEND and RLCTL_DOCTOR_DEVICE
from the environment, all-reduces ``rank + 1`` and prints one JSON line with the result.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta


def main() -> dict:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    backend, device_type = os.environ["RLCTL_DOCTOR_BACKEND"], os.environ["RLCTL_DOCTOR_DEVICE"]
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    if device_type == "npu":
        import torch_npu  # noqa: F401  (registers the npu device and hccl)
    device = torch.device(device_type, rank) if device_type != "cpu" else torch.device("cpu")
    if device_type != "cpu":
        getattr(torch, device_type).set_device(device)
    dist.init_process_group(backend, rank=rank, world_size=world, timeout=timedelta(seconds=60))
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
