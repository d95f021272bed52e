"""The batched fingerprint (one ``take`` per tensor, one table of sums) gives the verdicts a
straightforward per-tensor reference gives: same sampled elements, same cast, same weights.

Tensors are random in shape (0-d, empty, more and fewer elements than the sample count), stored
dtype (fp32, bf16, fp16, fp64) and layout (contiguous, transposed, strided, offset views); the
rollout copy is cast to a random dtype; on CPU, and on CUDA where one is present. ``Shard(0)`` pieces split unevenly over 1-4 ranks (some
empty) add up to the full tensor's fingerprint.
"""

from __future__ import annotations

import math
import types

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.distributed.tensor import Shard

from rlctl.engines.fingerprint import RTOL, checksum, fingerprint_params, fingerprint_views, same, sample_plan

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64]
LAYOUTS = ["contiguous", "transposed", "strided", "offset"]


def _reference(name: str, tensor: torch.Tensor, dtype: torch.dtype | None) -> tuple[float, float]:
    """The fingerprint computed one tensor at a time: index the plan's elements, cast, sum."""
    pos, w = sample_plan(name, tuple(tensor.shape))
    if tensor.numel() == 0:
        return 0.0, 0.0
    if tensor.dim() == 0:
        values = tensor.reshape(1).expand(pos.numel())
    else:
        values = tensor[torch.unravel_index(pos.to(tensor.device), tuple(tensor.shape))]
    if dtype is not None:
        values = values.to(dtype)
    x = values.to(device="cpu", dtype=torch.float64)
    return float((x * w).sum()), float((x.abs() * w).sum())


def _tensor(
    shape: tuple[int, ...], dtype: torch.dtype, layout: str, seed: int, device: str = "cpu"
) -> torch.Tensor:
    """A tensor of ``shape`` on ``device`` whose memory layout is ``layout`` (a view into a larger
    storage)."""
    g = torch.Generator().manual_seed(seed)

    def base(*size: int) -> torch.Tensor:
        return torch.randn(size, generator=g).to(device=device, dtype=dtype)

    if layout == "transposed" and len(shape) >= 2:
        out = base(*reversed(shape)).permute(*reversed(range(len(shape))))
    elif layout == "strided" and len(shape) >= 1:
        out = base(shape[0] * 2, *shape[1:])[::2]
    elif layout == "offset" and len(shape) >= 1:
        out = base(shape[0] + 3, *shape[1:]).narrow(0, 2, shape[0])
    else:
        out = base(*shape)
    assert tuple(out.shape) == shape
    return out


tensors = st.lists(
    st.tuples(
        st.lists(st.sampled_from([0, 1, 2, 3, 5, 9, 14]), min_size=0, max_size=3).map(tuple),
        st.sampled_from(DTYPES),
        st.sampled_from(LAYOUTS),
        st.sampled_from([None, *DTYPES]),
    ),
    min_size=1,
    max_size=8,
)


def _verdicts(trainer: dict, rollout: dict) -> list[str]:
    return [n for n in trainer if rollout[n] is None or not same(trainer[n], rollout[n])]


@given(specs=tensors, seed=st.integers(0, 2**16), which=st.integers(0, 7), at=st.integers(0, 10**6))
def test_batched_fingerprint_matches_the_per_tensor_reference(device, specs, seed, which, at):
    master = {
        f"t{i}": _tensor(shape, dtype, layout, seed + i, device)
        for i, (shape, dtype, layout, _) in enumerate(specs)
    }
    targets = {f"t{i}": target for i, (*_, target) in enumerate(specs)}
    ours = fingerprint_params(master.items(), targets)
    for name, tensor in master.items():
        ref = _reference(name, tensor, targets[name])
        assert same(ours[name], ref), (name, ours[name], ref)
        assert abs(ours[name][0] - ref[0]) <= 1e-13 * max(ref[1], 1.0)  # summation order only
        assert ours[name] == checksum(name, tensor, targets[name])

    # the rollout copy, cast as the sync's copy_ casts it, agrees tensor by tensor
    copies = {n: t.to(targets[n] or t.dtype) for n, t in master.items()}
    theirs = fingerprint_views([(n, tuple(t.shape)) for n, t in master.items()], lambda n, s: copies[n])
    assert _verdicts(ours, theirs) == []
    assert all(theirs[n][2] == str(copies[n].dtype).removeprefix("torch.") for n in master)

    # one element of one copy moved by 1.0: both ways of summing give the same verdicts, and a
    # sampled element is always caught
    name = f"t{which % len(specs)}"
    copy = copies[name]
    if copy.numel() == 0:
        return
    flat = at % copy.numel()
    idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), tuple(copy.shape)))
    copy[idx] = copy[idx] + 1.0
    theirs = fingerprint_views([(n, tuple(t.shape)) for n, t in master.items()], lambda n, s: copies[n])
    reference = {n: _reference(n, copies[n], None) for n in master}
    assert _verdicts(ours, theirs) == _verdicts(ours, reference)
    sampled = flat in set(sample_plan(name, tuple(copy.shape))[0].tolist())
    assert _verdicts(ours, theirs) == ([name] if sampled else [])


def test_views_report_none_for_missing_or_misshapen_tensors():
    w = torch.randn(4, 6)
    spec = [("a", (4, 6)), ("b", (4, 6)), ("c", (6, 4))]
    got = fingerprint_views(spec, lambda n, s: {"a": w, "c": w}.get(n))
    assert got["b"] is None and got["c"] is None
    assert got["a"][:2] == checksum("a", w) and got["a"][2] == "float32"
    assert fingerprint_views([], lambda n, s: None) == {} and fingerprint_params([]) == {}


class _Shard:
    """Rank ``rank`` of ``world``'s ``Shard(0)`` piece of ``full``, in ``torch.chunk`` sizes (FSDP2's):
    the DTensor attributes the fingerprint reads, nothing more."""

    def __init__(self, full: torch.Tensor, rank: int, world: int) -> None:
        chunks = torch.chunk(full, world) if full.shape[0] else ()
        empty = full.new_zeros((0, *full.shape[1:]))
        self.local = chunks[rank] if rank < len(chunks) else empty
        self.shape = full.shape
        self.placements = (Shard(0),)
        self.device_mesh = types.SimpleNamespace(ndim=1, size=lambda: world, get_local_rank=lambda: rank)

    def to_local(self) -> torch.Tensor:
        return self.local


@given(
    rows=st.integers(0, 40),
    inner=st.lists(st.sampled_from([1, 3, 7]), max_size=2).map(tuple),
    world=st.integers(1, 4),
    dtype=st.sampled_from(DTYPES),
    target=st.sampled_from([None, torch.bfloat16, torch.float32]),
    seed=st.integers(0, 2**16),
)
def test_shard_partials_add_up_to_the_full_tensor(rows, inner, world, dtype, target, seed):
    full = _tensor((rows, *inner), dtype, "contiguous", seed)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.distributed, "all_reduce", lambda table, group=None: None)  # sum below instead
        parts = [fingerprint_params([("w", _Shard(full, r, world))], {"w": target}) for r in range(world)]
    total = (math.fsum(p["w"][0] for p in parts), math.fsum(p["w"][1] for p in parts))
    ref = _reference("w", full, target)
    assert abs(total[0] - ref[0]) <= RTOL * ref[1] + 1e-300
    assert same(total, ref)


def test_positions_vary_per_sync_so_a_stale_region_is_caught_at_the_stated_rate():
    """A stale 1% region of a tensor: each salted sync reads it with probability
    1 - 0.99^64 = 0.47, independently; fixed positions would miss it at every sync or none."""
    from rlctl.engines.fingerprint import detection_probability

    g = torch.Generator().manual_seed(0)
    master = torch.randn(100, 100, generator=g)
    stale = master.clone()
    stale.view(-1)[4000:4100] += 1.0  # 1% of the elements, one contiguous region
    names = [f"layer{i}.w" for i in range(8)]  # the rate is an average over tensors' plans
    caught = [
        not same(checksum(n, master, salt=s), checksum(n, stale, salt=s)) for s in range(1, 101) for n in names
    ]
    p = detection_probability(0.01)
    assert p == pytest.approx(1 - 0.99**64)
    rate = sum(caught) / len(caught)
    assert abs(rate - p) < 4 * (p * (1 - p) / len(caught)) ** 0.5, rate  # binomial, 4 sigma
    runs = [all(not c for c in caught[i : i + 10]) for i in range(0, 800, 10)]
    assert sum(runs) / len(runs) < 0.05  # ten syncs in a row miss it with probability 0.0017
    assert detection_probability(0.01, syncs=10) == pytest.approx(1 - 0.99**640)
    assert sample_plan("w", (100, 100), salt=1)[0].tolist() != sample_plan("w", (100, 100), salt=2)[0].tolist()


def test_a_sampled_tensor_fingerprints_as_the_tensor_itself():
    from rlctl.engines.fingerprint import sample

    w = torch.randn(40, 24)
    got = fingerprint_params([("w", sample("w", w, salt=5))], {"w": torch.bfloat16}, salt=5)
    assert got["w"] == checksum("w", w, torch.bfloat16, salt=5)
    with pytest.raises(ValueError, match="salt"):
        fingerprint_params([("w", sample("w", w, salt=5))], salt=6)
