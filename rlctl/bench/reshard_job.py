"""One ``rlctl bench reshard`` job: ``max(p, q)`` spawned ranks, each holding its FSDP shards, running
one strategy into preallocated rollout tensors, checked exactly, timed (the trainer row runs the
loop's own ``PolicyWorker.sync_weights``)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import tempfile
import time

import torch

from rlctl.bench.reshard_device import BenchDevice, loopback_seconds
from rlctl.reshard.model import ModelSpec


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
    registry's FSDP2 training engine and HF rollout engine, both loaded from ``job["checkpoint"]``;
    at ``q > 1`` the engine is tensor-parallel and the sync writes its shards in place.
    Returns the timed callable and the rollout engine's tensors (checked after the timing)."""
    import types

    from rlctl.dispatch.mesh import Mesh
    from rlctl.dispatch.worker import WorkerContext
    from rlctl.engines.registry import get_engine
    from rlctl.profile.schema import RolloutSection
    from rlctl.trainer.plan.specs import RolloutSpec
    from rlctl.trainer.workers.roles import PolicyWorker

    path, model_type, q, order = job["checkpoint"], job["config"]["model_type"], job["q"], job["rank_order"]
    worker = PolicyWorker.__new__(PolicyWorker)  # what init_model builds, minus the loss and optimiser use
    worker._rlctl_ctx = WorkerContext(
        role="actor", rank=rank, world_size=world, local_rank=rank, local_world_size=world,
        mesh=Mesh.of(None, world).with_rollout(q, order), master_addr="127.0.0.1",
        master_port=int(os.environ.get("MASTER_PORT", 0)),
    )  # fmt: skip
    tp = {"tensor_parallel_size": q, "rank_order": order} if q > 1 else {}
    if q > 1:  # no loss or canary: the bench checks every byte itself
        worker.spec = types.SimpleNamespace(
            rollout=RolloutSpec(section=RolloutSection(tensor_parallel=q), rank_order=order), lora=None
        )
    worker.actor = get_engine("train", model_type, "fsdp2", "cpu")(path, device="cpu", dtype="bfloat16")
    worker.rollout = get_engine("rollout", model_type, "hf", "cpu")(
        path, device="cpu", dtype="bfloat16", **tp
    )
    torch.set_num_threads(1)  # the engines may have changed it

    def once() -> None:
        worker.sync_weights()

    return once, dict(worker.rollout.model.named_parameters())


def trainer_bucket() -> int:
    """The bucket the loop's sync uses (``rlctl.trainer.workers.planned_sync.SYNC_BUCKET_BYTES``)."""
    from rlctl.trainer.workers.planned_sync import SYNC_BUCKET_BYTES

    return SYNC_BUCKET_BYTES


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_job(job: dict) -> list[dict]:
    """Run one (model, p, q, strategy) in ``max(p, q)`` fresh processes (rank r on ``job["device"]``'s
    device r); per-rank results."""
    from rlctl.dispatch.local_ranks import spawn_ranks

    world = max(job["p"], job["q"])
    with tempfile.TemporaryDirectory(prefix="rlctl-reshard-", dir=job.get("tmpdir")) as outdir:
        spawn_ranks(_worker, world, (world, _port(), job, outdir))
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
