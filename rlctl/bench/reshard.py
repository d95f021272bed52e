"""``rlctl bench reshard``: train -> rollout layout transfer, planned vs naive all-gather vs disk.

Each (model, p, q, strategy) runs in its own group of spawned processes, so the peak extra memory per
rank is a real high-water mark above the rank's state after its train shards and rollout buffers
exist. All strategies fill the same preallocated rollout buffers (the rollout engine's own weights in
a colocated update) and must produce identical tensors.

Where the ranks run is one :class:`BenchDevice`: host memory (gloo, ``ru_maxrss``, host memcpy) or an
accelerator (``cuda:<rank>``, its collective backend, ``max_memory_allocated``, device-to-device copy
bandwidth timed with device events). The accelerator path is not yet run on NVIDIA hardware.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import socket
import tempfile
import time
from dataclasses import asdict, dataclass

import torch

from rlctl.reshard.model import ModelSpec

STRATEGIES = ("planned", "naive", "disk")

MODELS: dict[str, dict] = {
    "tiny": {  # ~1.05M params
        "model_type": "llama", "hidden_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
        "intermediate_size": 384, "vocab_size": 1000, "num_hidden_layers": 4, "tie_word_embeddings": False,
    },
    "qwen2-0.5b": {  # Qwen2-0.5B shape, full size (494M params)
        "model_type": "qwen2", "hidden_size": 896, "num_attention_heads": 14, "num_key_value_heads": 2,
        "intermediate_size": 4864, "vocab_size": 151936, "num_hidden_layers": 24, "tie_word_embeddings": True,
    },
    "7b-scaled": {  # Llama-2-7B widths; layers cut to fit memory (see scale_layers)
        "model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 32,
        "intermediate_size": 11008, "vocab_size": 32000, "num_hidden_layers": 32, "tie_word_embeddings": False,
    },
}  # fmt: skip

DEFAULT_PAIRS = {
    "tiny": [(1, 1), (2, 2), (4, 2), (2, 4)],
    "qwen2-0.5b": [(1, 1), (4, 2)],
    "7b-scaled": [(1, 1), (4, 2)],
}


@dataclass
class Row:
    model: str
    params: int
    p: int
    q: int
    strategy: str
    seconds: float
    bytes_out: int  # rollout bytes produced, all ranks
    bytes_moved: int  # bytes across ranks (+ written/read for disk)
    gbps: float  # bytes_out / seconds
    memcpy_gbps: float  # copy bandwidth where the ranks ran: host memcpy or device-to-device
    frac_memcpy: float | None  # single-process rows only: one process's transform vs its memcpy
    peak_extra_mb: float  # max over ranks of the RSS (host) / allocator (device) high-water above ready
    match: bool  # output equals the planned strategy's (checksums)
    device: str = "cpu"  # where the ranks' tensors lived: "cpu" or the accelerator type ("cuda")
    backend: str = "gloo"  # the collective backend the ranks used


def scale_layers(cfg: dict, max_bytes: int, itemsize: int = 2) -> dict:
    """Cut ``num_hidden_layers`` (>= 1) so the model fits ``max_bytes``."""
    from rlctl.reshard.model import spec_from_config

    cfg = dict(cfg)
    while cfg["num_hidden_layers"] > 1 and spec_from_config(cfg).nbytes() > max_bytes:
        cfg["num_hidden_layers"] -= 1
    return cfg


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


def _fill_shard(shape: tuple[int, ...], row0: int, dtype: torch.dtype) -> torch.Tensor:
    """Cheap deterministic values: every element depends on its global position."""
    n = 1
    for d in shape:
        n *= d
    cols = n // shape[0] if shape[0] else 1
    vals = torch.arange(row0 * cols, row0 * cols + n, dtype=torch.float32).remainder_(1021.0)
    return vals.to(dtype).reshape(shape)


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
        return getattr(torch, self.type)

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


def _worker(rank: int, world: int, port: int, job: dict, outdir: str) -> None:
    import torch.distributed as dist

    from rlctl.reshard.api import reshard_train_to_rollout, train_to_rollout_plan
    from rlctl.reshard.baselines import disk_reshard, naive_reshard
    from rlctl.reshard.layout import fsdp_shard_rows
    from rlctl.reshard.model import spec_from_config

    torch.set_num_threads(1)
    device: BenchDevice = job.get("device") or BenchDevice()
    where = device.bind(rank)
    if world > 1:
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
        device.init_group(rank, world)
    p, q, strategy, bucket = job["p"], job["q"], job["strategy"], job["bucket"]
    spec = spec_from_config(job["config"], torch.bfloat16)
    params = spec.hf_params()
    plan = train_to_rollout_plan(spec, p, q, bucket_bytes=bucket, rank_order=job["rank_order"])
    shards = {}
    if rank < p:
        for name, shape in params.items():
            a, b = fsdp_shard_rows(shape[0], p, rank)
            shards[name] = _fill_shard((b - a, *shape[1:]), a, spec.dtype).to(where)
    out = {lt.name: torch.empty(lt.shape, dtype=spec.dtype, device=where) for lt in plan.dst.ranks[rank]}
    for t in out.values():
        t.zero_()  # touch the pages: these are the rollout engine's weights, already resident
    path = os.path.join(outdir, "model.safetensors")

    def once() -> None:
        if strategy == "planned":
            for _items in reshard_train_to_rollout(
                spec, train_world=p, rank=rank, rollout_tp=q, local_shards=shards, bucket_bytes=bucket,
                rank_order=job["rank_order"], out=out, dtype=spec.dtype,
            ):  # fmt: skip
                pass
        else:
            # the baselines allocate their gather buffers on torch's default device: make it this
            # rank's device (host: left alone); disk loads the file to host memory and copies it in
            with contextlib.nullcontext() if device.on_host else torch.device(where):
                if strategy == "naive":
                    naive_reshard(params, shards, plan.dst, rank, p, spec.dtype, out=out)
                else:
                    disk_reshard(params, shards, plan.dst, rank, p, spec.dtype, path, out=out)

    base = device.mark()
    times = []
    for _ in range(job["repeat"]):
        if world > 1:
            dist.barrier()
        device.sync()
        t0 = time.perf_counter()
        once()
        device.sync()
        if world > 1:
            dist.barrier()
        times.append(time.perf_counter() - t0)
    peak = device.peak_since(base)
    copy_bw = device.copy_gbps(where)  # same process and thread setting, after the peak reading
    checksum = sum(float(t.double().sum()) for t in out.values())
    with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
        json.dump({"seconds": min(times), "peak": peak, "checksum": checksum, "memcpy_gbps": copy_bw}, f)
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_job(job: dict) -> list[dict]:
    """Run one (model, p, q, strategy) in ``max(p, q)`` fresh processes (rank r on ``job["device"]``'s
    device r); per-rank results."""
    import torch.multiprocessing as mp

    world = max(job["p"], job["q"])
    with tempfile.TemporaryDirectory(prefix="rlctl-reshard-", dir=job.get("tmpdir")) as outdir:
        mp.spawn(_worker, args=(world, _port(), job, outdir), nprocs=world, join=True)
        results = []
        for r in range(world):
            with open(os.path.join(outdir, f"rank{r}.json")) as f:
                results.append(json.load(f))
    return results


def bytes_moved(spec: ModelSpec, strategy: str, p: int, q: int, plan_bytes: int) -> int:
    world = max(p, q)
    model = spec.nbytes()
    if strategy == "planned":
        return plan_bytes
    if strategy == "naive":
        return (world - 1) * model if world > 1 else 0
    return model * (world - 1) // world + model + world * model  # gather + write + every rank reads


def bench(
    models: list[str],
    pairs: list[tuple[int, int]] | None = None,
    *,
    bucket_bytes: int = 64 << 20,
    repeat: int = 3,
    max_model_bytes: int = 1 << 30,
    rank_order: str = "strided",
    strategies: tuple[str, ...] = STRATEGIES,
    progress=None,
    device: BenchDevice | None = None,
    on_skip=None,
) -> list[Row]:
    """Measure every strategy on every (model, p, q) in one run; returns one Row per measurement.

    ``device`` (default: host memory) is where every rank runs; a (p, q) it cannot hold is left out
    and ``on_skip(case, reason)`` is told why.
    """
    from rlctl.reshard.api import train_to_rollout_plan
    from rlctl.reshard.layout import check_tp
    from rlctl.reshard.model import spec_from_config

    device = device or BenchDevice()
    rows: list[Row] = []
    for model in models:
        cfg = scale_layers(MODELS[model], max_model_bytes) if model == "7b-scaled" else MODELS[model]
        spec = spec_from_config(cfg, torch.bfloat16)
        for p, q in pairs or DEFAULT_PAIRS[model]:
            if check_tp(spec, q) or (max(p, q) % q):
                continue
            reason = skip_reason(device, p, q)
            if reason:
                if on_skip:
                    on_skip(f"{model} p={p} q={q}", reason)
                continue
            plan = train_to_rollout_plan(spec, p, q, bucket_bytes=bucket_bytes, rank_order=rank_order)
            out_bytes = sum(lt.numel for rank in plan.dst.ranks for lt in rank) * 2
            ref_sum = None
            for strategy in strategies:
                if progress:
                    progress(f"{model} p={p} q={q} {strategy}")
                job = {"config": cfg, "p": p, "q": q, "strategy": strategy, "bucket": bucket_bytes,
                       "repeat": repeat, "rank_order": rank_order, "device": device}  # fmt: skip
                res = run_job(job)
                secs = max(r["seconds"] for r in res)
                sums = [r["checksum"] for r in res]
                if ref_sum is None:
                    ref_sum = sums
                gbps = out_bytes / secs / 1e9
                copy_bw = max(r["memcpy_gbps"] for r in res)
                rows.append(
                    Row(
                        model,
                        spec.num_params(),
                        p,
                        q,
                        strategy,
                        secs,
                        out_bytes,
                        bytes_moved(spec, strategy, p, q, plan.bytes_moved()),
                        gbps,
                        copy_bw,
                        gbps / copy_bw if max(p, q) == 1 else None,
                        max(r["peak"] for r in res) / 2**20,
                        sums == ref_sum,
                        device.type,
                        device.backend,
                    )  # fmt: skip
                )
    return rows


def rows_json(rows: list[Row]) -> list[dict]:
    return [asdict(r) for r in rows]
