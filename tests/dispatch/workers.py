"""Worker classes shared by the dispatch tests (a module, so Ray processes can import them)."""

from __future__ import annotations

import os
import time

import torch

from rlctl.dispatch import DataProto, Dispatch, Execute, Worker, register


class EchoWorker(Worker):
    """Identity and bookkeeping methods for every dispatch mode."""

    def __init__(self, scale: float = 1.0) -> None:
        self.scale = scale
        self.calls = 0

    @register(Dispatch.DP_COMPUTE_PROTO)
    def double(self, batch: DataProto) -> DataProto:
        self.calls += 1
        return DataProto({"y": batch.batch["x"] * 2 * self.scale})

    @register(Dispatch.DP_COMPUTE_PROTO)
    def tag(self, batch: DataProto) -> DataProto:
        """Each output row says which rank made it (to check TP replication and representatives)."""
        n = len(batch)
        dp = self.mesh_coords.get("dp", 0)
        return DataProto(
            {"x": batch.batch["x"], "dp": torch.full((n,), dp), "rank": torch.full((n,), self.rank)}
        )

    @register(Dispatch.DP_COMPUTE_PROTO, blocking=False)
    def double_async(self, batch: DataProto) -> DataProto:
        return DataProto({"x": batch.batch["x"] * 2})

    @register(Dispatch.DP_COMPUTE_PROTO)
    def expand(self, batch: DataProto, k: int) -> DataProto:
        return batch.repeat(k, interleave=True)

    @register(Dispatch.ONE_TO_ALL)
    def rows(self, batch: DataProto) -> int:
        return len(batch)

    @register(Dispatch.DP_COMPUTE_METRICS)
    def stats(self, batch: DataProto) -> dict:
        return {"rows": len(batch), "rank": self.rank}

    @register(Dispatch.ONE_TO_ALL)
    def whoami(self) -> dict:
        return {
            "rank": self.rank,
            "world": self.world_size,
            "local_rank": self.local_rank,
            "coords": self.mesh_coords,
            "pid": os.getpid(),
            "role": self.role,
            "device": str(self.device),
        }

    @register(Dispatch.ALL_TO_ALL)
    def add(self, a: int, b: int) -> int:
        return a + b + self.rank

    @register(Dispatch.RANK_ZERO)
    def only_zero(self, v: int) -> tuple:
        return (self.rank, v)

    @register(Dispatch.ONE_TO_ALL, execute_mode=Execute.RANK_ZERO)
    def count_calls(self) -> int:
        return self.calls

    @register(Dispatch.ONE_TO_ALL)
    def fail_on(self, rank: int) -> int:
        if self.rank == rank:
            raise ValueError(f"boom on rank {rank}")
        return self.rank

    @register(Dispatch.ONE_TO_ALL)
    def sleep(self, seconds: float) -> int:
        time.sleep(seconds)
        return os.getpid()

    @register(Dispatch.ONE_TO_ALL)
    def allreduce(self, value: float) -> float:
        import torch.distributed as dist

        self.init_distributed("gloo")
        t = torch.tensor([value * (self.rank + 1)])
        dist.all_reduce(t)
        return float(t.item())


class RefWorker(Worker):
    @register(Dispatch.DP_COMPUTE_PROTO)
    def ref_log_prob(self, batch: DataProto) -> DataProto:
        return DataProto({"ref": batch.batch["x"] + 100})

    @register(Dispatch.ONE_TO_ALL)
    def pid(self) -> int:
        return os.getpid()


class RolloutWorker(Worker):
    @register(Dispatch.DP_COMPUTE_PROTO)
    def generate(self, batch: DataProto) -> DataProto:
        return DataProto({"x": batch.batch["x"] + 1})

    @register(Dispatch.ONE_TO_ALL)
    def pid(self) -> int:
        return os.getpid()


class BadInitWorker(Worker):
    def __init__(self) -> None:
        if self.rank == 1:
            raise RuntimeError("cannot load model on rank 1")


class FileSignalWorker(Worker):
    """Two groups that can only both finish if they run at the same time (one waits for the other)."""

    @register(Dispatch.ONE_TO_ALL)
    def wait_for(self, path: str, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if os.path.exists(path):
                return True
            time.sleep(0.05)
        return False

    @register(Dispatch.ONE_TO_ALL)
    def touch(self, path: str) -> int:
        with open(path, "w") as f:
            f.write("x")
        return os.getpid()
