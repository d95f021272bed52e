"""The peak resident set of an idle CPU policy worker: the constant ``rlctl plan`` adds on CPU.

``python -m rlctl.bench.worker_baseline`` starts one Ray worker process through the same dispatch
runtime a run uses, imports what a policy worker imports (the worker programs, the FSDP2 and
rollout engines, transformers' Llama and Qwen2 model code), starts torch's thread pool with one
small matmul and reports its VmHWM, holding no model. The figure is
``rlctl.trainer.plan.memory.CPU_WORKER_BASELINE_GIB``.
"""

from __future__ import annotations

from types import SimpleNamespace

from rlctl.dispatch import Dispatch, ResourcePool, Worker, register, spawn_colocated
from rlctl.trainer.workers.memory import PeakMemory


class IdleWorker(PeakMemory, Worker):
    """A policy worker's imports and thread pool, no tensors of any size."""

    def __init__(self) -> None:
        super().__init__()
        self.spec = SimpleNamespace(engine=SimpleNamespace(device_type="cpu"))

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        import torch
        import transformers.models.llama.modeling_llama  # noqa: F401
        import transformers.models.qwen2.modeling_qwen2  # noqa: F401
        from torch.distributed.fsdp import fully_shard  # noqa: F401

        import rlctl.engines.fsdp_train  # noqa: F401
        import rlctl.engines.hf_rollout  # noqa: F401
        import rlctl.trainer.workers.roles  # noqa: F401

        torch.ones(64, 64) @ torch.ones(64, 64)


def measure(backend: str = "ray") -> float:
    """The idle worker's peak resident set in GiB."""
    pool = ResourcePool(nodes=1, devices_per_node=1, resource="CPU")
    group = spawn_colocated(pool, {"idle": IdleWorker}, mesh={"dp": 1}, backend=backend)["idle"]
    try:
        group.init_model()
        return float(group.peak_memory()[0]["host_gib"])
    finally:
        group.shutdown()
        pool.release()


if __name__ == "__main__":
    print(f"idle CPU policy worker peak RSS: {measure():.3f} GiB")
