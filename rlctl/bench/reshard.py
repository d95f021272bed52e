"""``rlctl bench reshard``: train -> rollout weight sync, the planned reshard against what peers ship.

Every (model, depth, p, q, strategy) runs in its own group of ``max(p, q)`` spawned processes, each a
colocated trainer + rollout rank: it holds its FSDP dim-0 shard of every HF parameter and must end
with its rollout TP rank's tensors, preallocated (the rollout engine's own weights). Strategies:

* ``planned``: :func:`rlctl.reshard.reshard_train_to_rollout` (p2p ``batch_isend_irecv`` on gloo).
* ``verl`` / ``openrlhf`` / ``trl``: :mod:`rlctl.reshard.peer_baselines` (full tensor per parameter
  streamed in buckets; per-parameter gather + broadcast; whole-model gather).
* ``disk``: gather to rank 0, safetensors file (fsync), every rank loads it.
* ``trainer``: the exact weight sync the training loop runs, ``PolicyWorker.sync_weights`` of
  :mod:`rlctl.trainer.workers.roles` on the registry's FSDP2 training engine and HF rollout engine (TP 1,
  HF names: the only rollout layout the loop uses today), fingerprint check included.

Every rank's output is checked exactly: a SHA-256 of every tensor against the tensors vLLM's loaders
(or the HF engine) would hold, built independently (:mod:`rlctl.reshard.verify`); a mismatch is a
RunError naming the strategy, rank and tensor. Each multi-rank job also measures the transport's own
bandwidth (a ring of 64 MiB ``batch_isend_irecv`` messages among the same ranks) and the host's memcpy.

Where the ranks run is one :class:`BenchDevice`: host memory (gloo, ``ru_maxrss``, host memcpy) or an
accelerator (``cuda:<rank>``, its collective backend, ``max_memory_allocated``, device-to-device copy
bandwidth timed with device events). The accelerator path is not yet run on NVIDIA hardware; the peer
baselines and the trainer row run on the host only.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import socket
import tempfile
import time
from dataclasses import asdict, dataclass, field

import torch

from rlctl.reshard.model import ModelSpec

STRATEGIES = ("planned", "verl", "openrlhf", "trl", "disk", "trainer")
HOST_ONLY = ("verl", "openrlhf", "trl", "trainer")  # peer models and the trainer row run on host memory
TRANSPORT = {  # what moves the bytes, per strategy (gloo names; NCCL/HCCL use the same collectives)
    "planned": "p2p batch_isend_irecv",
    "verl": "all_gather per param + bucket",
    "openrlhf": "all_gather + broadcast per param",
    "trl": "all_gather whole model",
    "disk": "gather + safetensors file",
    "trainer": "PolicyWorker.sync_weights",
}

MODELS: dict[str, dict] = {
    "tiny": {  # ~1.05M params
        "model_type": "llama", "hidden_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
        "intermediate_size": 384, "vocab_size": 1000, "num_hidden_layers": 4, "tie_word_embeddings": False,
    },
    "qwen2-0.5b": {  # Qwen2-0.5B shape (494M params)
        "model_type": "qwen2", "hidden_size": 896, "num_attention_heads": 14, "num_key_value_heads": 2,
        "intermediate_size": 4864, "vocab_size": 151936, "num_hidden_layers": 24, "tie_word_embeddings": True,
    },
    "llama2-7b": {  # Llama-2-7B shape (6.74B params); layers kept cut to what fits (see fit_layers)
        "model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 32,
        "intermediate_size": 11008, "vocab_size": 32000, "num_hidden_layers": 32, "tie_word_embeddings": False,
    },
}  # fmt: skip
ALIASES = {"7b-scaled": "llama2-7b"}

DEFAULT_PAIRS = {
    "tiny": [(1, 1), (2, 2), (4, 2), (2, 4), (4, 1)],
    "qwen2-0.5b": [(1, 1), (4, 2), (4, 1)],
    "llama2-7b": [(1, 1), (4, 2), (4, 1)],
}
PROBE_PAIR = (4, 2)  # the pair measured at a second depth (planned and verl) for the per-layer cost
PROBE_STRATEGIES = ("planned", "verl")


@dataclass
class Row:
    model: str
    params: int  # parameters of the layers kept
    p: int
    q: int
    strategy: str
    seconds: float  # best of the timed repetitions, slowest rank
    bytes_out: int  # rollout bytes produced, all ranks
    bytes_moved: int  # bytes across ranks (+ written/read for disk)
    gbps: float  # bytes_out / seconds
    memcpy_gbps: float  # copy bandwidth where the ranks ran: host memcpy or device-to-device
    frac_memcpy: float | None  # single-process rows only: one process's transform vs its memcpy
    peak_extra_mb: float  # max over ranks of the RSS (host) / allocator (device) high-water above ready
    match: bool  # every tensor of every rank equals what the rollout engine loads (SHA-256)
    device: str = "cpu"  # where the ranks' tensors lived: "cpu" or the accelerator type ("cuda")
    backend: str = "gloo"  # the collective backend the ranks used
    layers_kept: int = 0
    layers_full: int = 0
    model_bytes: int = 0  # bytes of the layers kept (train dtype)
    fmt: str = "vllm"  # rollout layout: "vllm" (TP shards, merged qkv/gate_up) or "hf" (TP 1, HF names)
    rank_order: str = "contiguous"
    transport: str = ""
    bucket_bytes: int = 0
    recv_bytes_max: int = 0  # bytes the busiest rank receives
    loopback_gbps: float | None = None  # the transport's measured per-rank bandwidth in the same job
    frac_loopback: float | None = None  # (recv_bytes_max / loopback_gbps) / seconds
    verified: str = "sha256 of every tensor"


@dataclass
class LayerCost:
    """Time per decoder layer from two depths of one (model, p, q, strategy): a straight line."""

    model: str
    p: int
    q: int
    strategy: str
    depths: tuple[int, int]
    seconds: tuple[float, float]
    layers_full: int
    per_layer_s: float = field(init=False)
    fixed_s: float = field(init=False)
    full_model_s: float = field(init=False)  # the line read off at the full depth

    def __post_init__(self) -> None:
        (l1, l2), (t1, t2) = self.depths, self.seconds
        self.per_layer_s = (t2 - t1) / (l2 - l1)
        self.fixed_s = t1 - l1 * self.per_layer_s
        self.full_model_s = self.fixed_s + self.per_layer_s * self.layers_full


def resolve_model(name: str) -> str:
    return ALIASES.get(name, name)


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


def _shards(spec: ModelSpec, p: int, rank: int, where: torch.device) -> dict[str, torch.Tensor]:
    """This rank's FSDP2 dim-0 shard of every HF parameter, values from :func:`verify.fill`."""
    from rlctl.reshard.layout import fsdp_shard_rows
    from rlctl.reshard.verify import fill

    shards = {}
    if rank < p:
        for i, (name, shape) in enumerate(spec.hf_params().items()):
            a, b = fsdp_shard_rows(shape[0], p, rank)
            shards[name] = fill((b - a, *shape[1:]), a, i, spec.dtype, full_rows=shape[0]).to(where)
    return shards


def _corrupt(tensors: dict[str, torch.Tensor], name: str | None) -> None:
    """Fault injection for tests: swap two different values of one tensor (a misplaced value)."""
    name = name or next(n for n, t in tensors.items() if t.numel() > 1)
    flat = tensors[name].view(-1)
    j = int((flat != flat[0]).nonzero()[0])
    a, b = flat[0].clone(), flat[j].clone()
    flat[0], flat[j] = b, a


def _worker(rank: int, world: int, port: int, job: dict, outdir: str) -> None:
    import torch.distributed as dist

    from rlctl.reshard.api import reshard_train_to_rollout, train_to_rollout_plan
    from rlctl.reshard.baselines import disk_reshard
    from rlctl.reshard.model import spec_from_config
    from rlctl.reshard.peer_baselines import openrlhf_broadcast, trl_full_gather, verl_bucketed
    from rlctl.reshard.verify import digests

    torch.set_num_threads(1)
    device: BenchDevice = job.get("device") or BenchDevice()
    where = device.bind(rank)
    if world > 1:
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
        device.init_group(rank, world)
    p, q, strategy, bucket, fmt = job["p"], job["q"], job["strategy"], job["bucket"], job["fmt"]
    spec = spec_from_config(job["config"], torch.bfloat16)
    params = spec.hf_params()
    if strategy == "trainer":
        once, out = _trainer_sync(job, rank, world)
    else:
        plan = train_to_rollout_plan(spec, p, q, bucket_bytes=bucket, rank_order=job["rank_order"], fmt=fmt)
        shards = _shards(spec, p, rank, where)
        out = {lt.name: torch.empty(lt.shape, dtype=spec.dtype, device=where) for lt in plan.dst.ranks[rank]}
        for t in out.values():
            t.fill_(7)  # touch the pages (the rollout engine's weights, resident); never a right answer
        path = os.path.join(outdir, "model.safetensors")
        args = (params, shards, plan.dst, rank, p, spec.dtype)

        def once() -> None:
            if strategy == "planned":
                for _items in reshard_train_to_rollout(
                    spec, train_world=p, rank=rank, rollout_tp=q, local_shards=shards, bucket_bytes=bucket,
                    rank_order=job["rank_order"], fmt=fmt, out=out, dtype=spec.dtype,
                ):  # fmt: skip
                    pass
            elif strategy == "verl":
                verl_bucketed(*args, out=out, bucket_bytes=bucket)
            elif strategy == "openrlhf":
                openrlhf_broadcast(*args, out=out)
            elif strategy == "trl":
                trl_full_gather(*args, out=out)
            else:
                # disk allocates its gather buffers on torch's default device: make it this rank's
                # device (host: left alone); it loads the file to host memory and copies it in
                with contextlib.nullcontext() if device.on_host else torch.device(where):
                    disk_reshard(*args, path, out=out)

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
    loop_s = loopback_seconds() if world > 1 and device.on_host else None
    if job.get("corrupt") is not None and job["corrupt"].get("rank") == rank:
        _corrupt(out, job["corrupt"].get("tensor"))
    result = {"seconds": min(times), "peak": peak, "memcpy_gbps": copy_bw, "loopback_s": loop_s}
    result["digests"] = digests(out)
    with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()


def _trainer_sync(job: dict, rank: int, world: int):
    """The loop's own weight sync on real engines: ``PolicyWorker.sync_weights`` (unchanged) on the
    registry's FSDP2 training engine and HF rollout engine, both loaded from ``job["checkpoint"]``.
    Returns the timed callable and the rollout engine's tensors (checked after the timing)."""
    from rlctl.dispatch.mesh import Mesh
    from rlctl.dispatch.worker import WorkerContext
    from rlctl.engines.registry import get_engine
    from rlctl.trainer.workers.roles import PolicyWorker

    path, model_type = job["checkpoint"], job["config"]["model_type"]
    worker = PolicyWorker.__new__(PolicyWorker)  # what init_model builds, minus the loss and optimiser use
    worker._rlctl_ctx = WorkerContext(
        role="actor", rank=rank, world_size=world, local_rank=rank, local_world_size=world,
        mesh=Mesh.of(None, world), master_addr="127.0.0.1", master_port=int(os.environ.get("MASTER_PORT", 0)),
    )  # fmt: skip
    worker.actor = get_engine("train", model_type, "fsdp2", "cpu")(path, device="cpu", dtype="bfloat16")
    worker.rollout = get_engine("rollout", model_type, "hf", "cpu")(path, device="cpu", dtype="bfloat16")
    torch.set_num_threads(1)  # the engines may have changed it

    def once() -> None:
        worker.sync_weights()

    return once, dict(worker.rollout.model.named_parameters())


def _trainer_bucket() -> int:
    """The bucket the loop's sync uses (``rlctl.trainer.workers.roles.SYNC_BUCKET_BYTES``)."""
    from rlctl.trainer.workers.roles import SYNC_BUCKET_BYTES

    return SYNC_BUCKET_BYTES


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
    """Bytes that cross ranks (disk: + written and read back)."""
    world = max(p, q)
    model = spec.nbytes()
    if strategy in ("planned", "trainer"):
        return plan_bytes
    if world == 1:
        return 0 if strategy != "disk" else 2 * model
    if strategy in ("verl", "trl"):
        return (world - 1) * model * (p - 1) // p + (world - p) * model
    if strategy == "openrlhf":
        return (world - 1) * model * (p - 1) // p + (world - p) * model + (world - 1) * model
    return model * (world - 1) // world + model + world * model  # gather + write + every rank reads


def write_checkpoint(cfg: dict, full: dict[str, torch.Tensor], path: str) -> None:
    """An HF checkpoint directory (config.json + model.safetensors) holding ``full``."""
    from safetensors.torch import save_file
    from transformers import AutoConfig

    os.makedirs(path, exist_ok=True)
    config = AutoConfig.for_model(**{k: v for k, v in cfg.items() if v is not None})
    config.torch_dtype = "bfloat16"
    config.to_json_file(os.path.join(path, "config.json"))
    save_file({k: v.contiguous() for k, v in full.items()}, os.path.join(path, "model.safetensors"))


@dataclass
class _Case:
    model: str
    cfg: dict
    p: int
    q: int
    strategies: tuple[str, ...]


def plan_cases(
    models: list[str],
    pairs: list[tuple[int, int]] | None,
    strategies: tuple[str, ...],
    max_model_bytes: int | None,
    device: BenchDevice,
) -> list[_Case]:
    """Every case to run, in order: each model at the depth that fits (all strategies), then the
    headline pair at a second depth (bounded-memory strategies) where layers were cut."""
    from rlctl.reshard.layout import check_tp
    from rlctl.reshard.model import spec_from_config

    cases = []
    for model in models:
        full_cfg = MODELS[model]
        model_pairs = pairs or DEFAULT_PAIRS[model]
        world = max(max(p, q) for p, q in model_pairs)
        # every strategy fits: TRL and disk hold a whole model per rank next to shards and outputs
        budget = max_model_bytes or memory_budget(world, copies=2.5)
        cfg = scale_layers(full_cfg, budget)
        spec = spec_from_config(cfg, torch.bfloat16)
        for p, q in model_pairs:
            if check_tp(spec, q) or (max(p, q) % q):
                continue
            chosen = tuple(s for s in strategies if s != "trainer" or q == 1)
            if not device.on_host:
                chosen = tuple(s for s in chosen if s not in HOST_ONLY)
            cases.append(_Case(model, cfg, p, q, chosen))
        kept = cfg["num_hidden_layers"]
        if (
            kept < full_cfg["num_hidden_layers"]
            and PROBE_PAIR in model_pairs
            and not check_tp(spec, PROBE_PAIR[1])
        ):
            # planned and verl hold shards + outputs + a bucket: about 1/p + 1/q of a model per rank
            p, q = PROBE_PAIR
            deeper = fit_layers(
                full_cfg,
                max_model_bytes * 2 if max_model_bytes else memory_budget(max(p, q), 1 / p + 1 / q + 0.25),
            )
            deeper = min(deeper, kept + 3)
            probe = tuple(s for s in PROBE_STRATEGIES if s in strategies)
            if deeper > kept and probe:
                cases.append(_Case(model, with_layers(full_cfg, deeper), p, q, probe))
    return cases


def bench(
    models: list[str],
    pairs: list[tuple[int, int]] | None = None,
    *,
    bucket_bytes: int = 64 << 20,
    repeat: int = 3,
    max_model_bytes: int | None = None,
    rank_order: str = "contiguous",
    strategies: tuple[str, ...] = STRATEGIES,
    progress=None,
    device: BenchDevice | None = None,
    on_skip=None,
    corrupt: dict | None = None,
) -> list[Row]:
    """Measure every strategy on every (model, p, q) in one run; returns one Row per measurement.

    ``device`` (default: host memory) is where every rank runs; a (p, q) it cannot hold is left out
    and ``on_skip(case, reason)`` is told why. Every output is checked: RunError on any tensor that
    differs from what the rollout engine loads. ``corrupt`` (tests): ``{"rank": r, "tensor": name,
    "strategy": s}`` swaps two values of that rank's output after the timing, to prove the check.
    """
    from rlctl.reshard.api import train_to_rollout_plan
    from rlctl.reshard.model import spec_from_config
    from rlctl.reshard.peer_baselines import recv_bytes_per_rank
    from rlctl.reshard.verify import check, expected_digests, full_state

    models = [resolve_model(m) for m in models]
    device = device or BenchDevice()
    rows: list[Row] = []
    cases = plan_cases(models, pairs, strategies, max_model_bytes, device)
    with tempfile.TemporaryDirectory(prefix="rlctl-reshard-ckpt-") as ckdir:
        for case in cases:
            reason = skip_reason(device, case.p, case.q)
            if reason:
                if on_skip:
                    on_skip(f"{case.model} p={case.p} q={case.q}", reason)
                continue
            cfg, p, q = case.cfg, case.p, case.q
            world = max(p, q)
            fmt = "hf" if q == 1 else "vllm"
            spec = spec_from_config(cfg, torch.bfloat16)
            plan = train_to_rollout_plan(
                spec, p, q, bucket_bytes=bucket_bytes, rank_order=rank_order, fmt=fmt
            )
            out_bytes = sum(lt.numel for rank in plan.dst.ranks for lt in rank) * 2
            plan_recv = (
                max(sum(rnd[r].recv_numel() for rnd in plan.rounds) for r in range(world)) * plan.itemsize
            )
            full = full_state(spec.hf_params(), spec.dtype)
            want = expected_digests(cfg, full, world, q, rank_order, fmt)
            checkpoint = None
            if "trainer" in case.strategies:
                checkpoint = os.path.join(ckdir, f"{case.model}-{cfg['num_hidden_layers']}")
                if not os.path.exists(checkpoint):
                    write_checkpoint(cfg, full, checkpoint)
            del full
            for strategy in case.strategies:
                if progress:
                    progress(f"{case.model} ({cfg['num_hidden_layers']} layers) p={p} q={q} {strategy}")
                job = {"config": cfg, "p": p, "q": q, "strategy": strategy, "bucket": bucket_bytes,
                       "repeat": repeat, "rank_order": rank_order, "device": device, "fmt": fmt,
                       "checkpoint": checkpoint}  # fmt: skip
                if corrupt and corrupt.get("strategy", strategy) == strategy:
                    job["corrupt"] = corrupt
                res = run_job(job)
                what = f"{strategy} ({case.model}, {cfg['num_hidden_layers']} layers, p={p} -> q={q}, {fmt})"
                check(what, [r["digests"] for r in res], want)
                secs = max(r["seconds"] for r in res)
                gbps = out_bytes / secs / 1e9
                copy_bw = max(r["memcpy_gbps"] for r in res)
                loop_s = [r["loopback_s"] for r in res if r["loopback_s"] is not None]
                loop_gbps = (64 << 20) / max(loop_s) / 1e9 if loop_s else None
                if strategy in ("planned", "trainer"):
                    recv = plan_recv
                elif strategy == "disk":
                    recv = 0
                else:
                    recv = recv_bytes_per_rank(strategy, spec.nbytes(), p, world)
                frac_loop = recv / 1e9 / loop_gbps / secs if loop_gbps and recv else None
                rows.append(
                    Row(
                        case.model,
                        spec.num_params(),
                        p,
                        q,
                        strategy,
                        secs,
                        out_bytes,
                        bytes_moved(spec, strategy, p, q, plan.bytes_moved()),
                        gbps,
                        copy_bw,
                        gbps / copy_bw if world == 1 else None,
                        max(r["peak"] for r in res) / 2**20,
                        True,
                        device.type,
                        device.backend,
                        cfg["num_hidden_layers"],
                        MODELS[case.model]["num_hidden_layers"],
                        spec.nbytes(),
                        fmt,
                        rank_order,
                        TRANSPORT[strategy] if world > 1 else "local copies",
                        _trainer_bucket() if strategy == "trainer" else bucket_bytes,
                        recv,
                        loop_gbps,
                        frac_loop,
                    )  # fmt: skip
                )
    return rows


def layer_costs(rows: list[Row]) -> list[LayerCost]:
    """Per-layer cost of every (model, p, q, strategy) measured at two depths."""
    by: dict[tuple, dict[int, float]] = {}
    full: dict[str, int] = {}
    for r in rows:
        by.setdefault((r.model, r.p, r.q, r.strategy), {})[r.layers_kept] = r.seconds
        full[r.model] = r.layers_full
    out = []
    for (model, p, q, strategy), depths in by.items():
        if len(depths) >= 2:
            (l1, t1), (l2, t2) = sorted(depths.items())[:2]
            out.append(LayerCost(model, p, q, strategy, (l1, l2), (t1, t2), full[model]))
    return out


def peer_ratios(rows: list[Row]) -> dict[tuple, dict[str, float]]:
    """Per (model, layers, p, q): each other strategy's seconds over planned's."""
    planned = {(r.model, r.layers_kept, r.p, r.q): r.seconds for r in rows if r.strategy == "planned"}
    out: dict[tuple, dict[str, float]] = {}
    for r in rows:
        key = (r.model, r.layers_kept, r.p, r.q)
        if r.strategy != "planned" and key in planned:
            out.setdefault(key, {})[r.strategy] = r.seconds / planned[key]
    return out


def rows_json(rows: list[Row]) -> list[dict]:
    return [asdict(r) for r in rows]
