"""``rlctl bench dispatch``: what a DP_COMPUTE_PROTO call costs the driver, against raw Ray.

For each batch size (~1 MB, ~100 MB of float32) and group size (2, 4 workers) one run measures,
side by side on the same Ray:

- ``dispatch``: ``wg.echo(batch)`` on a WorkerGroup, the method being the identity: pad/split,
  put, run on every rank, get, concat, unpad - the whole call as the driver sees it;
- ``raw_round_trip``: the same movement written by hand with raw Ray on plain actors:
  ``ray.put`` each numpy chunk, an identity actor method per chunk, ``ray.get``, ``np.concatenate``;
- ``raw_put_get``: ``ray.put`` + ``ray.get`` of the whole batch's bytes once (the floor of moving
  those bytes through the object store at all; no workers, zero-copy get).

Ratios are ``dispatch / raw_round_trip`` (the dispatch layer's overhead; the target is <= 1.2 at
100 MB; also given best-vs-best, which shows the floor on a noisy host) and ``dispatch / raw_put_get``.
The known extra cost over raw Ray is one copy per rank of its input shard: unpickled tensors own
writable memory instead of aliasing the immutable object store (see ``rlctl.dispatch.proto``). Medians of ``repeats`` rounds after one warm-up; the three sides alternate within each round.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from rlctl.dispatch import DataProto, Dispatch, ResourcePool, Worker, WorkerGroup, register
from rlctl.dispatch.ray_network import bind_loopback

ROWS = 1024


class EchoBenchWorker(Worker):
    """The cheapest possible DP_COMPUTE_PROTO method: give the shard back."""

    @register(Dispatch.DP_COMPUTE_PROTO)
    def echo(self, batch: DataProto) -> DataProto:
        return batch


class _RawEcho:
    def echo(self, arr: np.ndarray) -> np.ndarray:
        return arr


@dataclass
class DispatchBenchConfig:
    sizes_mb: tuple[float, ...] = (1.0, 100.0)
    workers: tuple[int, ...] = (2, 4)
    repeats: int = 5
    address: str | None = None
    object_store_mb: int = 1500
    extra: dict[str, Any] = field(default_factory=dict)


def make_batch(size_mb: float) -> DataProto:
    """A DataProto of ~``size_mb`` MB: one float32 tensor of ROWS rows."""
    cols = max(1, int(size_mb * 1024 * 1024 / 4 / ROWS))
    return DataProto({"x": torch.randn(ROWS, cols)})


def _interleaved(fns: dict[str, Any], repeats: int) -> dict[str, list[float]]:
    """Time each function once per round, rounds interleaved, so load drift hits all sides alike."""
    for fn in fns.values():
        fn()  # warm-up: first-call costs (imports, connections) are not what we compare
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return times


def _ensure_ray(cfg: DispatchBenchConfig, max_workers: int) -> bool:
    """Connect (or start a local Ray sized for the bench); True if this call started it."""
    import ray

    if ray.is_initialized():
        return False
    if cfg.address in (None, "", "local"):
        bind_loopback()
        ray.init(
            num_cpus=max(2, max_workers * 2),
            object_store_memory=cfg.object_store_mb * 1024 * 1024,
            include_dashboard=False,
            log_to_driver=False,
        )
    else:
        ray.init(address=cfg.address, log_to_driver=False)
    return True


def run_dispatch_bench(cfg: DispatchBenchConfig | None = None) -> dict[str, Any]:
    """Measure every (size, workers) case; returns a JSON-able dict with rows and ratios."""
    import ray

    cfg = cfg or DispatchBenchConfig()
    started = _ensure_ray(cfg, max(cfg.workers))
    rows = []
    try:
        raw_cls = ray.remote(num_cpus=0.25)(_RawEcho)
        for n in cfg.workers:
            pool = ResourcePool(1, n, name=f"bench-dispatch-{n}")
            wg = WorkerGroup(pool, EchoBenchWorker, role="bench", env={"OMP_NUM_THREADS": "1"})
            raw = [raw_cls.remote() for _ in range(n)]
            ray.get([a.echo.remote(np.zeros(1)) for a in raw])
            try:
                for size in cfg.sizes_mb:
                    rows.append(_measure(wg, raw, make_batch(size), n, cfg.repeats))
            finally:
                wg.shutdown()
                for a in raw:
                    ray.kill(a)
                pool.release()
    finally:
        if started:
            ray.shutdown()
    return {
        "config": {
            "sizes_mb": list(cfg.sizes_mb),
            "workers": list(cfg.workers),
            "repeats": cfg.repeats,
            "rows_per_batch": ROWS,
        },
        "rows": rows,
    }


def _measure(wg: WorkerGroup, raw: list[Any], batch: DataProto, n: int, repeats: int) -> dict[str, Any]:
    import ray

    arr = batch.batch["x"].numpy()

    def dispatch() -> None:
        out = wg.echo(batch)
        assert len(out) == len(batch)

    def raw_round_trip() -> None:
        chunks = np.split(arr, n)
        refs = [a.echo.remote(ray.put(c)) for a, c in zip(raw, chunks, strict=True)]
        out = np.concatenate(ray.get(refs))
        assert out.shape == arr.shape

    def raw_put_get() -> None:
        out = ray.get(ray.put(arr))
        assert out.shape == arr.shape

    t = _interleaved(
        {"dispatch": dispatch, "raw_round_trip": raw_round_trip, "raw_put_get": raw_put_get}, repeats
    )
    med = {k: statistics.median(v) for k, v in t.items()}
    return {
        "size_mb": round(batch.nbytes / 2**20, 2),
        "workers": n,
        "dispatch_s": med["dispatch"],
        "raw_round_trip_s": med["raw_round_trip"],
        "raw_put_get_s": med["raw_put_get"],
        "ratio_vs_round_trip": med["dispatch"] / med["raw_round_trip"],
        "ratio_vs_put_get": med["dispatch"] / med["raw_put_get"],
        "ratio_best_vs_round_trip": min(t["dispatch"]) / min(t["raw_round_trip"]),
        "samples": t,
    }
