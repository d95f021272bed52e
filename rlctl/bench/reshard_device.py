"""Where ``rlctl bench reshard`` runs and what the host allows: model depth scaled to the memory
budget, the host's memcpy and loopback bandwidth, and the :class:`BenchDevice` its ranks use
(host memory over gloo, or ``cuda:<rank>`` with the device's own allocator and copy timing)."""

from __future__ import annotations

import resource
import time
from dataclasses import dataclass

import torch

from rlctl.devices import runtime_of


def with_layers(cfg: dict, layers: int) -> dict:
    return {**cfg, "num_hidden_layers": layers}


def fit_layers(cfg: dict, max_bytes: int, itemsize: int = 2) -> int:
    """The most decoder layers (>= 1, <= the model's) whose parameters fit ``max_bytes``."""
    from rlctl.reshard.model import spec_from_config

    layers = cfg["num_hidden_layers"]
    while layers > 1 and spec_from_config(with_layers(cfg, layers)).nbytes() > max_bytes:
        layers -= 1
    return layers


def scale_layers(cfg: dict, max_bytes: int, itemsize: int = 2) -> dict:
    """``cfg`` with ``num_hidden_layers`` cut to what fits ``max_bytes``."""
    return with_layers(cfg, fit_layers(cfg, max_bytes, itemsize))


def available_bytes() -> int:
    """MemAvailable of this host (Linux); a cautious 8 GiB where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 << 30


def memory_budget(world: int, copies: float, share: float = 0.5) -> int:
    """Model bytes that fit when ``world`` ranks each hold ``copies`` model-sized buffers in
    ``share`` of the host's available memory (the host is shared: half by default)."""
    return int(available_bytes() * share / (world * copies))


def memcpy_gbps(nbytes: int = 64 << 20, repeat: int = 3) -> float:
    """This host's copy bandwidth: best ``dst.copy_(src)`` over warm buffers, payload bytes / s."""
    src = torch.ones(nbytes, dtype=torch.uint8)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t0)
    return nbytes / best / 1e9


def loopback_seconds(nbytes: int = 64 << 20, repeat: int = 3) -> float:
    """Best time of one ring step among all ranks of the default group: each rank sends ``nbytes``
    to the next and receives as much from the previous, all at once (``batch_isend_irecv``)."""
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    send = torch.ones(nbytes, dtype=torch.uint8)
    recv = torch.empty_like(send)
    best = float("inf")
    for _ in range(repeat + 1):  # the first round warms the connections
        ops = [
            dist.P2POp(dist.isend, send, (rank + 1) % world),
            dist.P2POp(dist.irecv, recv, (rank - 1) % world),
        ]
        dist.barrier()
        t0 = time.perf_counter()
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        dist.barrier()
        best = min(best, time.perf_counter() - t0)
    return best


def _rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# collective backend of each device type the bench can run on (rlctl/platforms: nvidia/rocm -> nccl)
BACKEND_OF_DEVICE = {"cpu": "gloo", "cuda": "nccl"}


@dataclass(frozen=True)
class BenchDevice:
    """Where a bench rank's tensors live, its collective, and how its time, peak memory and copy
    bandwidth are read. ``type`` "cpu": host memory, any number of ranks. Otherwise an accelerator
    type whose torch module (``torch.cuda``) is read through :meth:`accel`; one device per rank,
    since NCCL refuses two ranks on one device.
    """

    type: str = "cpu"
    backend: str = "gloo"

    @property
    def on_host(self) -> bool:
        return self.type == "cpu"

    def accel(self):  # noqa: ANN201 - torch.cuda or an equivalent module
        return runtime_of(self.type).module

    def count(self) -> int | None:
        """How many ranks fit (one per device); None on the host (no limit)."""
        return None if self.on_host else int(self.accel().device_count())

    def torch_device(self, local_rank: int) -> torch.device:
        return torch.device("cpu") if self.on_host else torch.device(self.type, local_rank)

    def bind(self, local_rank: int) -> torch.device:
        """Make ``local_rank``'s device current in this process; returns it."""
        where = self.torch_device(local_rank)
        if not self.on_host:
            self.accel().set_device(where)
        return where

    def init_group(self, rank: int, world: int) -> None:
        import torch.distributed as dist

        where = self.torch_device(rank)
        kw = {"device_id": where} if where.type != "cpu" else {}  # gloo refuses a cpu device_id
        dist.init_process_group(self.backend, rank=rank, world_size=world, **kw)

    def sync(self) -> None:
        """Wait for this process's queued device work (nothing to wait for on the host)."""
        if not self.on_host:
            self.accel().synchronize()

    def mark(self) -> int:
        """Start a peak-memory window at the current state; returns its baseline in bytes."""
        if self.on_host:
            return _rss_bytes()
        accel = self.accel()
        accel.synchronize()
        accel.reset_peak_memory_stats()
        return int(accel.memory_allocated())

    def peak_since(self, base: int) -> int:
        """High-water bytes above ``base`` since :meth:`mark`: RSS on the host, allocator on a device."""
        if self.on_host:
            return _rss_bytes() - base
        accel = self.accel()
        accel.synchronize()
        return int(accel.max_memory_allocated()) - base

    def copy_gbps(self, where: torch.device) -> float:
        """Copy bandwidth of ``where``, payload bytes / s: host memcpy, or device-to-device timed with
        device events over 256 MiB (best of 5 warm copies)."""
        if self.on_host:
            return memcpy_gbps(64 << 20, 3)
        accel, nbytes = self.accel(), 256 << 20
        src = torch.ones(nbytes, dtype=torch.uint8, device=where)
        dst = torch.empty_like(src)
        dst.copy_(src)
        accel.synchronize()
        best = float("inf")
        for _ in range(5):
            start, end = accel.Event(enable_timing=True), accel.Event(enable_timing=True)
            start.record()
            dst.copy_(src)
            end.record()
            end.synchronize()
            best = min(best, start.elapsed_time(end) / 1e3)  # elapsed_time is in milliseconds
        del src, dst
        return nbytes / best / 1e9


def resolve_device(name: str) -> BenchDevice:
    """``--device`` value -> BenchDevice; UserError when the device type is unknown or not visible."""
    from rlctl.errors import UserError

    if name not in BACKEND_OF_DEVICE:
        raise UserError(f"--device: {name!r} is not supported; expected one of {sorted(BACKEND_OF_DEVICE)}")
    device = BenchDevice(name, BACKEND_OF_DEVICE[name])
    if not device.on_host and not device.accel().is_available():
        build = f"torch {torch.__version__}" + (
            "" if torch.version.cuda or torch.version.hip else ", built without CUDA"
        )
        raise UserError(
            f"--device {name}: torch sees no {name} device on this host ({build}); use --device cpu"
        )
    return device


def skip_reason(device: BenchDevice, p: int, q: int) -> str | None:
    """Why (p, q) cannot run on ``device``, or None when it can."""
    if device.on_host:
        return None
    world, count = max(p, q), device.count()
    if world > count:
        return (
            f"needs {world} {device.type} devices, one per rank ({device.backend} refuses two ranks on one "
            f"device); {count} visible"
        )
    if q > p:
        return (
            "q > p: ranks that hold no train shard would stage their send/receive buffers in host memory "
            "(rlctl/reshard/executor.py RankExecutor takes its device from the shards)"
        )
    return None
