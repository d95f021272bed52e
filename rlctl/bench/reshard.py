"""``rlctl bench reshard``: train -> rollout weight sync, the planned reshard against what peers ship.

Every (model, depth, p, q, strategy) runs in its own group of ``max(p, q)`` spawned processes, each a
colocated trainer + rollout rank: it holds its FSDP dim-0 shard of every HF parameter and must end
with its rollout TP rank's tensors, preallocated (the rollout engine's own weights). Strategies:

* ``planned``: :func:`rlctl.reshard.reshard_train_to_rollout` (p2p ``batch_isend_irecv`` on gloo).
* ``verl`` / ``openrlhf`` / ``trl``: :mod:`rlctl.reshard.peer_baselines` (full tensor per parameter
  streamed in buckets; per-parameter gather + broadcast; whole-model gather).
* ``disk``: gather to rank 0, safetensors file (fsync), every rank loads it.
* ``trainer``: the exact weight sync the training loop runs, ``PolicyWorker.sync_weights`` of
  :mod:`rlctl.trainer.workers.roles` on the registry's FSDP2 training engine and HF rollout engine,
  fingerprint check included: at q = 1 whole HF tensors on every rank; at q > 1 the planned move
  into the tensor-parallel engine's own shards (layout ``hf_tp``), measured in a case of its own
  beside ``planned`` and ``verl`` into the same layout.

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

import os
import tempfile
from dataclasses import asdict, dataclass, field

import torch

from rlctl.bench.reshard_device import (
    BenchDevice,
    fit_layers,
    memory_budget,
    resolve_device,  # noqa: F401  (the CLI takes it from here; tests patch it here)
    scale_layers,
    skip_reason,
    with_layers,
)
from rlctl.bench.reshard_job import bytes_moved, run_job, trainer_bucket, write_checkpoint

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
    fmt: str = "vllm"  # rollout layout: "vllm" (TP shards, merged qkv/gate_up), "hf" (TP 1) or "hf_tp" (HF engine TP)
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


@dataclass
class _Case:
    model: str
    cfg: dict
    p: int
    q: int
    strategies: tuple[str, ...]
    fmt: str = ""  # rollout layout; "" = HF names at q = 1, vLLM's TP shards above


def plan_cases(
    models: list[str],
    pairs: list[tuple[int, int]] | None,
    strategies: tuple[str, ...],
    max_model_bytes: int | None,
    device: BenchDevice,
) -> list[_Case]:
    """Every case to run, in order: each model at the depth that fits (all strategies), then the
    headline pair at a second depth (bounded-memory strategies) where layers were cut."""
    from rlctl.reshard.layout import check_hf_tp, check_tp
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
            if (
                q > 1
                and "trainer" in strategies
                and device.on_host
                and p % q == 0
                and not check_hf_tp(spec, q)
            ):
                # the loop's own sync into the HF engine's TP shards, beside planned and verl into the same layout
                in_loop = tuple(s for s in ("planned", "verl", "trainer") if s in strategies)
                cases.append(_Case(model, cfg, p, q, in_loop, "hf_tp"))
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
            fmt = case.fmt or ("hf" if q == 1 else "vllm")
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
                        trainer_bucket() if strategy == "trainer" else bucket_bytes,
                        recv,
                        loop_gbps,
                        frac_loop,
                    )  # fmt: skip
                )
    return rows


def layer_costs(rows: list[Row]) -> list[LayerCost]:
    """Per-layer cost of every (model, p, q, strategy) measured at two depths in one layout."""
    by: dict[tuple, dict[int, float]] = {}
    full: dict[str, int] = {}
    for r in rows:
        by.setdefault((r.model, r.p, r.q, r.strategy, r.fmt), {})[r.layers_kept] = r.seconds
        full[r.model] = r.layers_full
    out = []
    for (model, p, q, strategy, _), depths in by.items():
        if len(depths) >= 2:
            (l1, t1), (l2, t2) = sorted(depths.items())[:2]
            out.append(LayerCost(model, p, q, strategy, (l1, l2), (t1, t2), full[model]))
    return out


def peer_ratios(rows: list[Row]) -> dict[tuple, dict[str, float]]:
    """Per (model, layers, p, q, layout): each other strategy's seconds over planned's."""
    planned = {(r.model, r.layers_kept, r.p, r.q, r.fmt): r.seconds for r in rows if r.strategy == "planned"}
    out: dict[tuple, dict[str, float]] = {}
    for r in rows:
        key = (r.model, r.layers_kept, r.p, r.q, r.fmt)
        if r.strategy != "planned" and key in planned:
            out.setdefault(key, {})[r.strategy] = r.seconds / planned[key]
    return out


def rows_json(rows: list[Row]) -> list[dict]:
    return [asdict(r) for r in rows]
