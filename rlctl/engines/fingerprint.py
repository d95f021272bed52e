"""Cheap fingerprints of model weights, so two copies of a model can be compared after a sync.

Per tensor: a weighted float64 sum over a fixed pseudo-random sample of its elements, with
positions and weights drawn from a seed derived from the tensor's name and shape (the same in
every process). Both copies fingerprint the *same* elements, so a copy that missed an update, got
another tensor's values, or was corrupted shows up as a different sum, at the cost of reading
``SAMPLES`` elements per tensor (no full-tensor pass, no gather of the model).

The sum is taken after casting the sampled elements to the dtype the rollout copy stores, so an
fp32 master compared with its bf16 rollout copy agrees exactly (the cast is the one the copy's
``copy_`` does: round to nearest even). Sums over FSDP shards are added up over ranks, which
changes the float64 rounding order only: :func:`same` allows ``1e-10`` of the absolute sum,
far below what changing one sampled element by one bf16 or fp32 step changes.

Engines know nothing of RL: this is tensor arithmetic plus one all-reduce.
"""

from __future__ import annotations

import functools
import math
import zlib
from collections.abc import Iterable, Mapping, Sequence

import torch

SAMPLES = 64  # elements read per tensor
RTOL = 1e-10  # of the weighted absolute sum (float64 rounding order across shards)

Shape = tuple[int, ...]
Checksum = tuple[float, float]  # (weighted sum, weighted sum of absolute values)


@functools.lru_cache(maxsize=8192)
def sample_plan(name: str, shape: Shape, k: int = SAMPLES) -> tuple[torch.Tensor, torch.Tensor]:
    """Sorted flat positions (int64) and float64 weights in [0.5, 1.5) of the sampled elements.

    Seeded by ``crc32(name + shape)`` on a CPU generator, so every process with the same torch
    draws the same plan (Python's ``hash`` is salted per process; crc32 is not).
    """
    numel = math.prod(shape)
    if numel == 0:
        return torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.float64)
    g = torch.Generator().manual_seed(zlib.crc32(f"{name}{tuple(shape)}".encode()))
    pos, _ = torch.randint(0, numel, (k,), generator=g).sort()
    weights = torch.rand(k, generator=g, dtype=torch.float64) + 0.5
    return pos, weights


def _weighted(values: torch.Tensor, weights: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """``[sum(w x), sum(w |x|)]`` in float64 on the host, ``x`` cast to ``dtype`` first."""
    if dtype is not None:
        values = values.to(dtype)
    x = values.detach().to(device="cpu", dtype=torch.float64)
    return torch.stack([(x * weights).sum(), (x.abs() * weights).sum()])


def _gather(tensor: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
    """Elements at flat (row-major) positions of any-strided ``tensor``, without a copy of it."""
    if tensor.dim() == 0:
        return tensor.reshape(1).expand(flat.numel())
    idx = torch.unravel_index(flat.to(tensor.device), tuple(tensor.shape))
    return tensor[idx]


def checksum(name: str, tensor: torch.Tensor, dtype: torch.dtype | None = None) -> Checksum:
    """Fingerprint of a full tensor (any device, any strides), its elements cast to ``dtype``."""
    pos, w = sample_plan(name, tuple(tensor.shape))
    s, a = _weighted(_gather(tensor, pos), w, dtype).tolist()
    return s, a


def _rows_of_shard(param, global_shape: Shape) -> int:
    """First global row of this rank's ``Shard(0)`` DTensor piece (FSDP2 uses ``torch.chunk``
    sizes: ``ceil(n / world)`` rows per rank, the last ranks possibly fewer or none)."""
    from torch.distributed.tensor import Shard

    mesh, placements = param.device_mesh, param.placements
    if mesh.ndim != 1 or tuple(placements) != (Shard(0),):
        raise NotImplementedError(f"fingerprint of a DTensor with placements {placements} on {mesh}")
    n, world, rank = global_shape[0], mesh.size(), mesh.get_local_rank()
    chunk = -(-n // world)
    start = min(rank * chunk, n)
    local_rows = param.to_local().shape[0]
    if local_rows != max(0, min(n, start + chunk) - start):
        raise NotImplementedError(f"shard of {local_rows} rows does not follow torch.chunk of {n} rows")
    return start


def _partial(name: str, param: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """This rank's share of the fingerprint of ``param`` (all of it for a plain tensor)."""
    shape = tuple(param.shape)
    pos, w = sample_plan(name, shape)
    if not hasattr(param, "to_local"):
        return _weighted(_gather(param, pos), w, dtype)
    local = param.to_local()
    start = _rows_of_shard(param, shape)
    inner = math.prod(shape[1:])
    rows = pos // inner if inner else pos
    mine = (rows >= start) & (rows < start + local.shape[0])
    if not bool(mine.any()):
        return torch.zeros(2, dtype=torch.float64)
    return _weighted(_gather(local, pos[mine] - start * inner), w[mine], dtype)


def fingerprint_params(
    named: Iterable[tuple[str, torch.Tensor]],
    dtypes: Mapping[str, torch.dtype | None] | None = None,
    *,
    device: torch.device | str = "cpu",
    group=None,
) -> dict[str, Checksum]:
    """Fingerprints of a model's parameters as they are held: plain tensors or ``Shard(0)``
    DTensors (FSDP2). Every rank of a sharded model must call this with the same names; the
    per-rank partial sums cross in one all-reduce of ``2 x n_tensors`` float64 on ``device``.
    ``dtypes[name]`` is the dtype to compare in (the rollout copy's), ``None`` as stored.
    """
    dtypes = dtypes or {}
    names: list[str] = []
    parts: list[torch.Tensor] = []
    sharded = False
    with torch.no_grad():
        for name, param in named:
            sharded = sharded or hasattr(param, "to_local")
            names.append(name)
            parts.append(_partial(name, param.detach(), dtypes.get(name)))
    if not parts:
        return {}
    table = torch.stack(parts)
    if sharded:
        import torch.distributed as dist

        table = table.to(device)
        dist.all_reduce(table, group=group)
        table = table.cpu()
    return {n: (float(s), float(a)) for n, (s, a) in zip(names, table.tolist(), strict=True)}


def fingerprint_views(
    spec: Sequence[tuple[str, Shape]], view_of
) -> dict[str, tuple[float, float, str] | None]:
    """Rollout-side fingerprints: ``view_of(name, shape)`` returns the engine's tensor for that HF
    name viewed in the HF shape, or None where it cannot; values are ``(sum, abs sum, dtype)``."""
    out: dict[str, tuple[float, float, str] | None] = {}
    with torch.no_grad():
        for name, shape in spec:
            view = view_of(name, tuple(shape))
            if view is None or tuple(view.shape) != tuple(shape):
                out[name] = None
                continue
            s, a = checksum(name, view)
            out[name] = (s, a, str(view.dtype).removeprefix("torch."))
    return out


def same(trainer: Checksum, rollout: Sequence[float]) -> bool:
    """Whether two fingerprints of one tensor agree (NaN on both sides counts as agreeing: the
    trainer's own weights are broken then, which is not a sync fault)."""
    t, r = trainer[0], float(rollout[0])
    if math.isnan(t) or math.isnan(r):
        return math.isnan(t) and math.isnan(r)
    return abs(t - r) <= RTOL * max(trainer[1], float(rollout[1])) + 1e-300


def dtype_named(name: str) -> torch.dtype:
    """``"bfloat16"`` -> ``torch.bfloat16`` (the dtype names :func:`fingerprint_views` reports)."""
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"not a torch dtype: {name!r}")
    return dtype
