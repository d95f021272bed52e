"""Run a plan for every rank inside one process (tests, debugging, single-device runs).

The exchange below is ``all_to_all_single`` semantics written out: rank ``d`` receives, in source
rank order, the segment each rank ``s`` packed for ``d``. Everything else is the real executor.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch

from rlctl.reshard.executor import RankExecutor
from rlctl.reshard.plan import Plan


@dataclass
class LoopbackStats:
    """What the fake collective saw: the largest send+recv buffer bytes per rank in any round."""

    max_buffer_bytes: list[int]
    collectives: int = 0


def exchange(
    sends: Sequence[torch.Tensor], in_splits: Sequence[Sequence[int]], recvs: Sequence[torch.Tensor]
) -> None:
    """In-memory all_to_all_single over all ranks at once."""
    world = len(sends)
    offsets = [[0] * (world + 1) for _ in range(world)]
    for s in range(world):
        for d in range(world):
            offsets[s][d + 1] = offsets[s][d] + in_splits[s][d]
    for d in range(world):
        off = 0
        for s in range(world):
            n = in_splits[s][d]
            recvs[d][off : off + n].copy_(sends[s][offsets[s][d] : offsets[s][d] + n])
            off += n
        if off != recvs[d].numel():
            raise AssertionError(f"loopback: rank {d} expected {recvs[d].numel()} elements, got {off}")


def run_all_ranks(
    plan: Plan,
    sources: Sequence[Mapping[str, torch.Tensor]],
    dtype: torch.dtype,
    stats: LoopbackStats | None = None,
) -> Iterator[list[list[tuple[str, torch.Tensor]]]]:
    """Yields, per round, every rank's finished (name, tensor) list."""
    world = plan.world
    execs = [RankExecutor(plan, r, sources[r], dtype=dtype) for r in range(world)]
    for i in range(len(plan.rounds)):
        started = [e.start(i) for e in execs]
        if stats is not None:
            for r, (send, _, recv, _) in enumerate(started):
                nbytes = (send.numel() + recv.numel()) * send.element_size()
                stats.max_buffer_bytes[r] = max(stats.max_buffer_bytes[r], nbytes)
        if plan.comm_rounds[i]:
            exchange([s[0] for s in started], [s[1] for s in started], [s[2] for s in started])
            if stats is not None:
                stats.collectives += 1
        for e in execs:
            e.local(i)
        yield [e.finish(i, s[0], s[2]) for e, s in zip(execs, started, strict=True)]


def collect_all_ranks(
    plan: Plan, sources: Sequence[Mapping[str, torch.Tensor]], dtype: torch.dtype
) -> list[dict[str, torch.Tensor]]:
    """Convenience: run every round and return each rank's full destination dict."""
    out: list[dict[str, torch.Tensor]] = [{} for _ in range(plan.world)]
    for per_rank in run_all_ranks(plan, sources, dtype):
        for r, done in enumerate(per_rank):
            out[r].update(done)
    return out
