"""Cheap fingerprints of model weights, so two copies of a model can be compared after a sync.

Per tensor: a weighted float64 sum over a pseudo-random sample of its elements, with positions
and weights drawn from a seed derived from the tensor's name, its shape and a *salt* (the same in
every process; the sync check passes the sync's count, so each sync reads other positions). Both
copies fingerprint the *same* elements, so a copy that missed an update, got another tensor's
values, or was corrupted shows up as a different sum, at the cost of reading ``SAMPLES`` elements
per tensor (no full-tensor pass, no gather of the model).

Each salt shifts the tensor's fixed random positions cyclically by its own offset (one add per
tensor on its device; the plan itself is drawn once). Detection: a stale region covering a fraction
``f`` of a tensor's elements (each of them different in the compared dtype) is read by one sync
with probability ``1 - (1 - f)^SAMPLES`` (on average over tensors' plans)
(:func:`detection_probability`: f = 1% -> 0.47; 5% -> 0.96; a whole tensor -> 1), and with
positions drawn afresh per sync, one that stays stale for ``n`` syncs escapes all of them with
probability ``(1 - f)^(SAMPLES n)`` (1%: 0.53 once, 0.0017 over ten syncs). Fixed positions
would miss the same region at every sync.

The sum is taken after casting the sampled elements to the dtype the rollout copy stores, so an
fp32 master compared with its bf16 rollout copy agrees exactly (the cast is the one the copy's
``copy_`` does: round to nearest even). Sums over FSDP shards are added up over ranks, which
changes the float64 rounding order only: :func:`same` allows ``1e-10`` of the absolute sum,
far below what changing one sampled element by one bf16 or fp32 step changes.

A model's tensors are fingerprinted together: one ``take`` of each tensor's sampled elements
(flat positions, any strides), then per (device, stored dtype, compare dtype) one cast and one
copy to the host, and one pass of weighted sums over an ``(n_tensors, SAMPLES)`` float64 table.
Per-tensor work is a single op, which is what a sync of a small model is dominated by.

Engines know nothing of RL: this is tensor arithmetic plus one all-reduce.
"""

from __future__ import annotations

import functools
import math
import zlib
from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

import torch

SAMPLES = 64  # elements read per tensor
RTOL = 1e-10  # of the weighted absolute sum (float64 rounding order across shards)

Shape = tuple[int, ...]
Checksum = tuple[float, float]  # (weighted sum, weighted sum of absolute values)


def detection_probability(stale_fraction: float, syncs: int = 1, k: int = SAMPLES) -> float:
    """Probability that ``syncs`` fingerprints with fresh positions read at least one element of a
    stale region holding ``stale_fraction`` of a tensor's elements (module docstring)."""
    return 1.0 - (1.0 - stale_fraction) ** (k * syncs)


@functools.lru_cache(maxsize=8192)
def _base_plan(name: str, shape: Shape, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The tensor's fixed plan: sorted flat positions and float64 weights in [0.5, 1.5), seeded by
    ``crc32(name + shape)`` on a CPU generator, so every process with the same torch draws the same
    plan (Python's ``hash`` is salted per process; crc32 is not)."""
    numel = math.prod(shape)
    if numel == 0:
        return torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.float64)
    g = torch.Generator().manual_seed(zlib.crc32(f"{name}{tuple(shape)}".encode()))
    pos, _ = torch.randint(0, numel, (k,), generator=g).sort()
    weights = torch.rand(k, generator=g, dtype=torch.float64) + 0.5
    return pos, weights


def _shift(name: str, shape: Shape, salt: int) -> int:
    """The salt's cyclic shift of the tensor's positions (0 for salt 0), from two crc32s."""
    numel = math.prod(shape)
    if not salt or numel <= 1:
        return 0
    key = f"{name}{tuple(shape)}#{salt}"
    return ((zlib.crc32(key.encode()) << 32) | zlib.crc32(key[::-1].encode())) % numel


def sample_plan(
    name: str, shape: Shape, k: int = SAMPLES, salt: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Flat positions (int64) and float64 weights of the sampled elements for ``salt``: the
    tensor's fixed random plan (:func:`_base_plan`) shifted cyclically by a per-salt offset, so
    each sync reads other elements at the cost of one add per tensor."""
    pos, weights = _base_plan(name, tuple(shape), k)
    shift = _shift(name, tuple(shape), salt)
    return ((pos + shift) % math.prod(shape) if shift else pos), weights


_ALL = torch.arange(SAMPLES)  # sample indices of a tensor read whole
_NO_WEIGHTS = torch.zeros(SAMPLES, dtype=torch.float64)  # the weight row of an empty tensor


@functools.lru_cache(maxsize=8192)
def _base_positions(name: str, shape: Shape, device: torch.device) -> torch.Tensor:
    """The fixed plan's flat positions on ``device`` (moved once, not at every sync)."""
    return _base_plan(name, shape, SAMPLES)[0].to(device)


def _positions(name: str, shape: Shape, device: torch.device, salt: int = 0) -> torch.Tensor:
    """The salt's flat positions on ``device``: the cached plan, shifted there."""
    base = _base_positions(name, shape, device)
    shift = _shift(name, shape, salt)
    return torch.remainder(base + shift, math.prod(shape)) if shift else base


@functools.lru_cache(maxsize=8192)
def _shard_positions(
    name: str, shape: Shape, start: int, rows: int, device: torch.device, salt: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Flat positions in a ``Shard(0)`` piece holding global rows ``[start, start + rows)`` of the
    plan's elements that fall in it (on ``device``), and which of the plan's samples they are."""
    pos, _ = sample_plan(name, shape, salt=salt)
    inner = math.prod(shape[1:])
    row = pos // inner if inner else pos
    mine = (row >= start) & (row < start + rows)
    return (pos[mine] - start * inner).to(device), mine.nonzero().reshape(-1)


class _Entry(NamedTuple):
    """One tensor's share of a fingerprint table: read ``tensor`` (plain, any strides) at flat
    ``positions``; they are samples ``index`` of a plan with ``weights``; cast to ``dtype`` first."""

    tensor: torch.Tensor
    positions: torch.Tensor
    index: torch.Tensor
    weights: torch.Tensor
    dtype: torch.dtype | None


class Sampled(NamedTuple):
    """A tensor's plan samples taken as it streamed past (:func:`sample`), in plan order: what the
    sync check fingerprints of a tensor that is not kept (a LoRA actor's merged weights)."""

    shape: Shape
    values: torch.Tensor
    salt: int


def sample(name: str, tensor: torch.Tensor, salt: int = 0) -> Sampled:
    """The plan's samples of a full ``tensor`` (a copy of ``SAMPLES`` elements, on its device)."""
    shape = tuple(tensor.shape)
    with torch.no_grad():
        return Sampled(shape, torch.take(tensor.detach(), _positions(name, shape, tensor.device, salt)), salt)


def _whole(name: str, tensor: torch.Tensor, dtype: torch.dtype | None, salt: int = 0) -> _Entry:
    """The entry of a plain tensor: all of its plan's samples."""
    shape = tuple(tensor.shape)
    w = _base_plan(name, shape, SAMPLES)[1]  # the weights do not depend on the salt
    return _Entry(tensor, _positions(name, shape, tensor.device, salt), _ALL, w, dtype)


def _sums(entries: Sequence[_Entry]) -> torch.Tensor:
    """``(n, 2)`` float64 on the host: ``[sum(w x), sum(w |x|)]`` per entry, ``x`` cast to its dtype.

    Every tensor costs one ``take`` of its samples; the casts, the copy to the host and the sums
    run once per (device, stored dtype, target dtype) group over a ``(n, SAMPLES)`` table, where
    a sample a shard does not hold is 0 (adding 0 changes no sum).
    """
    n = len(entries)
    groups: dict[tuple, list[int]] = {}
    for i, e in enumerate(entries):
        if e.positions.numel():
            groups.setdefault((e.tensor.device, e.tensor.dtype, e.dtype), []).append(i)
    table = torch.zeros(n * SAMPLES, dtype=torch.float64)
    for (_, _, dtype), members in groups.items():
        values = torch.cat([torch.take(entries[i].tensor, entries[i].positions) for i in members])
        if dtype is not None:
            values = values.to(dtype)  # the rollout copy's rounding, on the tensor's device
        counts = torch.tensor([entries[i].positions.numel() for i in members])
        rows = torch.tensor(members) * SAMPLES
        slots = torch.cat([entries[i].index for i in members]) + rows.repeat_interleave(counts)
        table[slots] = values.to(device="cpu", dtype=torch.float64)
    weights = torch.stack([e.weights if e.weights.numel() else _NO_WEIGHTS for e in entries])
    x = table.view(n, SAMPLES)
    return torch.stack([(x * weights).sum(1), (x.abs() * weights).sum(1)], dim=1)


def checksum(name: str, tensor: torch.Tensor, dtype: torch.dtype | None = None, salt: int = 0) -> Checksum:
    """Fingerprint of a full tensor (any device, any strides), its elements cast to ``dtype``."""
    with torch.no_grad():
        s, a = _sums([_whole(name, tensor, dtype, salt)])[0].tolist()
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


def _partial(name: str, param: torch.Tensor | Sampled, dtype: torch.dtype | None, salt: int) -> _Entry:
    """This rank's share of the fingerprint of ``param`` (all of it for a plain tensor)."""
    if isinstance(param, Sampled):
        if param.salt != salt:
            raise ValueError(f"{name}: sampled for salt {param.salt}, fingerprinted with salt {salt}")
        n = param.values.numel()
        weights = _base_plan(name, tuple(param.shape), SAMPLES)[1]
        return _Entry(param.values, torch.arange(n, device=param.values.device), _ALL[:n], weights, dtype)
    if not hasattr(param, "to_local"):
        return _whole(name, param, dtype, salt)
    shape = tuple(param.shape)
    start = _rows_of_shard(param, shape)
    local = param.to_local()
    positions, index = _shard_positions(name, shape, start, local.shape[0], local.device, salt)
    return _Entry(local, positions, index, _base_plan(name, shape, SAMPLES)[1], dtype)


def fingerprint_params(
    named: Iterable[tuple[str, torch.Tensor | Sampled]],
    dtypes: Mapping[str, torch.dtype | None] | None = None,
    *,
    device: torch.device | str = "cpu",
    group=None,
    salt: int = 0,
) -> dict[str, Checksum]:
    """Fingerprints of a model's parameters as they are held: plain tensors, ``Shard(0)``
    DTensors (FSDP2) or :class:`Sampled` (taken with the same ``salt``). Every rank of a sharded
    model must call this with the same names; the per-rank partial sums cross in one all-reduce of
    ``2 x n_tensors`` float64 on ``device``. ``dtypes[name]`` is the dtype to compare in (the
    rollout copy's), ``None`` as stored.
    """
    dtypes = dtypes or {}
    names: list[str] = []
    entries: list[_Entry] = []
    sharded = False
    with torch.no_grad():
        for name, param in named:
            sharded = sharded or hasattr(param, "to_local")
            names.append(name)
            entries.append(_partial(name, param, dtypes.get(name), salt))
        if not entries:
            return {}
        table = _sums(entries)
    if sharded:
        import torch.distributed as dist

        table = table.to(device)
        dist.all_reduce(table, group=group)
        table = table.cpu()
    return {n: (s, a) for n, (s, a) in zip(names, table.tolist(), strict=True)}


def fingerprint_views(
    spec: Sequence[tuple[str, Shape]], view_of, salt: int = 0
) -> dict[str, tuple[float, float, str] | None]:
    """Rollout-side fingerprints: ``view_of(name, shape)`` returns the engine's tensor for that HF
    name viewed in the HF shape, or None where it cannot; values are ``(sum, abs sum, dtype)``."""
    out: dict[str, tuple[float, float, str] | None] = {}
    names: list[str] = []
    entries: list[_Entry] = []
    with torch.no_grad():
        for name, shape in spec:
            view = view_of(name, tuple(shape))
            out[name] = None
            if view is not None and tuple(view.shape) == tuple(shape):
                names.append(name)
                entries.append(_whole(name, view, None, salt))
        rows = _sums(entries).tolist() if entries else []
    for name, e, (s, a) in zip(names, entries, rows, strict=True):
        out[name] = (s, a, str(e.tensor.dtype).removeprefix("torch."))
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


@functools.lru_cache(maxsize=8192)
def _column_positions(
    name: str, shape: Shape, start: int, cols: int, device: torch.device, salt: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """As :func:`_shard_positions` for a ``Shard(1)`` piece of a 2-D tensor holding global columns
    ``[start, start + cols)`` (a row-parallel weight of tensor parallelism)."""
    pos, _ = sample_plan(name, shape, salt=salt)
    width = shape[1]
    row, col = pos // width, pos % width
    mine = (col >= start) & (col < start + cols)
    return (row[mine] * cols + col[mine] - start).to(device), mine.nonzero().reshape(-1)


def _split_entry(name: str, local: torch.Tensor, split, salt: int = 0) -> _Entry:
    """This rank's share of a tensor-parallel piece's fingerprint: ``split`` has ``dim`` (0, or 1 of
    a 2-D tensor), ``start`` (the piece's first global index on it) and ``full`` (the whole shape)."""
    shape = tuple(split.full)
    if split.dim == 0:
        positions, index = _shard_positions(name, shape, split.start, local.shape[0], local.device, salt)
    elif split.dim == 1 and len(shape) == 2:
        positions, index = _column_positions(name, shape, split.start, local.shape[1], local.device, salt)
    else:
        raise NotImplementedError(f"fingerprint of {name!r} split on dim {split.dim} of {shape}")
    return _Entry(local, positions, index, sample_plan(name, shape, salt=salt)[1], None)


def fingerprint_sharded(
    spec: Sequence[tuple[str, Shape]],
    params: Mapping[str, torch.Tensor],
    splits: Mapping,
    group,
    salt: int = 0,
) -> dict[str, tuple[float, float, str] | None]:
    """Rollout-side fingerprints of a tensor-parallel model: ``params`` are this rank's tensors
    (pieces where ``splits[name]`` says how the full tensor was split, whole copies elsewhere).
    Each rank reads the plan's samples that fall in its pieces and the partial sums are added over
    the TP ``group`` (one all-reduce), so every rank holds the fingerprint of each whole tensor,
    comparable with the trainer's; a piece one rank failed to update changes the sum every rank of
    its group reports. ``salt`` picks the positions, as the trainer's side does. Every rank of the
    group must call this with the same ``spec`` and ``salt``."""
    out: dict[str, tuple[float, float, str] | None] = {}
    entries: list[tuple[str, _Entry, bool]] = []
    with torch.no_grad():
        for name, shape in spec:
            param, split = params.get(name), splits.get(name)
            out[name] = None
            held = (
                tuple(split.full) if split is not None else tuple(param.shape) if param is not None else None
            )
            if param is None or held != tuple(shape):
                continue
            entry = (
                _split_entry(name, param, split, salt)
                if split is not None
                else _whole(name, param, None, salt)
            )
            entries.append((name, entry, split is not None))
        if not entries:
            return out
        table = _sums([e for _, e, _ in entries])
        pieces = torch.tensor([s for _, _, s in entries])
        if bool(pieces.any()):
            import torch.distributed as dist

            partial = (table * pieces[:, None]).to(entries[0][1].tensor.device)
            dist.all_reduce(partial, group=group)
            table = torch.where(pieces[:, None], partial.cpu(), table)
    for (name, entry, _), (s, a) in zip(entries, table.tolist(), strict=True):
        out[name] = (s, a, str(entry.tensor.dtype).removeprefix("torch."))
    return out
