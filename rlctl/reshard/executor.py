"""Executor: run a :class:`~rlctl.reshard.plan.Plan` on one rank, round by round.

Per round a rank packs what it sends into one flat buffer (grouped by destination rank), runs one
``all_to_all_single`` (any torch.distributed backend: gloo, NCCL, HCCL), does its local copies while
the collective is in flight, unpacks the receive buffer into its destination tensors and hands back
the tensors finished in that round. Extra memory at any time: the round's send + receive buffers
(at most ``bucket_bytes`` by construction of the plan) plus destination tensors not yet handed back.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import torch

from rlctl.errors import RunError
from rlctl.reshard.plan import Plan, Transfer

# all_to_all(recv, send, out_splits, in_splits) -> object with .wait(); splits in elements
AllToAll = Callable[[torch.Tensor, torch.Tensor, list[int], list[int]], object]


@dataclass
class MemoryMeter:
    """Bytes the executor holds beyond the inputs: comm buffers and unfinished outputs."""

    buffers: int = 0
    outputs: int = 0
    peak_buffers: int = 0
    peak_total: int = 0

    def add(self, buffers: int = 0, outputs: int = 0) -> None:
        self.buffers += buffers
        self.outputs += outputs
        self.peak_buffers = max(self.peak_buffers, self.buffers)
        self.peak_total = max(self.peak_total, self.buffers + self.outputs)


def _as2d(t: torch.Tensor) -> torch.Tensor:
    if t.dim() == 0:
        return t.reshape(1, 1)
    cols = 1
    for d in t.shape[1:]:
        cols *= d
    return t.view(t.shape[0], cols) if t.is_contiguous() else t.reshape(t.shape[0], cols)


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (FSDP2 parameters), or the tensor itself."""
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


class RankExecutor:
    """Executes ``plan`` for ``rank`` given its source tensors (name -> tensor, DTensors allowed)."""

    def __init__(
        self,
        plan: Plan,
        rank: int,
        sources: Mapping[str, torch.Tensor],
        *,
        dtype: torch.dtype,
        device: torch.device | str | None = None,
        out: Mapping[str, torch.Tensor] | None = None,
    ) -> None:
        self.plan, self.rank, self.dtype = plan, rank, dtype
        self.meter = MemoryMeter()
        self._out = out or {}
        self._src: list[torch.Tensor] = []
        for lt in plan.src.ranks[rank]:
            if lt.name not in sources:
                raise RunError(f"reshard rank {rank}: source tensor {lt.name!r} missing ({plan.src.kind})")
            t = local_tensor(sources[lt.name]).detach()  # a weight move: never part of an autograd graph
            if tuple(t.shape) != lt.shape:
                raise RunError(
                    f"reshard rank {rank}: {lt.name!r} has shape {tuple(t.shape)}, {plan.src.kind} expects {lt.shape}"
                )
            if t.dtype != dtype:
                raise RunError(f"reshard rank {rank}: {lt.name!r} is {t.dtype}, expected {dtype}")
            self._src.append(_as2d(t))
        if device is None:
            # a rank without train shards (q > p) still exchanges buffers on its outputs' device
            device = (
                self._src[0].device
                if self._src
                else next((t.device for t in self._out.values()), torch.device("cpu"))
            )
        self.device = torch.device(device)
        self._dst: dict[int, torch.Tensor] = {}
        self._given: dict[int, torch.Tensor] = {}  # caller's tensors, handed back as given

    def _alloc(self, ti: int) -> None:
        lt = self.plan.dst.ranks[self.rank][ti]
        given = self._out.get(lt.name)
        if given is not None:
            if tuple(given.shape) != lt.shape or given.dtype != self.dtype:
                raise RunError(
                    f"reshard rank {self.rank}: out[{lt.name!r}] is {tuple(given.shape)} {given.dtype}, "
                    f"{self.plan.dst.kind} needs {lt.shape} {self.dtype}"
                )
            t = given.detach()  # same storage: filled in place without autograd (parameters may need grad)
            self._given[ti] = given
        else:
            t = torch.empty(lt.shape, dtype=self.dtype, device=self.device)
            self.meter.add(outputs=t.numel() * t.element_size())
        if lt.padded:
            t.zero_()  # vocab padding rows; the blocks overwrite the rest
        self._dst[ti] = t

    def start(self, i: int) -> tuple[torch.Tensor, list[int], torch.Tensor, list[int]]:
        """Allocate this round's outputs and pack the send buffer; returns (send, in_splits, recv, out_splits)."""
        rr = self.plan.rounds[i][self.rank]
        for ti in rr.allocate:
            self._alloc(ti)
        world = self.plan.world
        in_splits = [sum(t.numel for t in rr.sends.get(d, ())) for d in range(world)]
        out_splits = [sum(t.numel for t in rr.recvs.get(s, ())) for s in range(world)]
        send = torch.empty(sum(in_splits), dtype=self.dtype, device=self.device)
        recv = torch.empty(sum(out_splits), dtype=self.dtype, device=self.device)
        self.meter.add(buffers=(send.numel() + recv.numel()) * send.element_size())
        off = 0
        for pieces in rr.sends.values():
            for t in pieces:
                seg = send[off : off + t.numel].view(t.rows, t.cols)
                seg.copy_(
                    self._src[t.src_tensor][t.src_row : t.src_row + t.rows, t.src_col : t.src_col + t.cols]
                )
                off += t.numel
        return send, in_splits, recv, out_splits

    def _dst_view(self, t: Transfer) -> torch.Tensor:
        return _as2d(self._dst[t.dst_tensor])[t.dst_row : t.dst_row + t.rows, t.dst_col : t.dst_col + t.cols]

    def local(self, i: int) -> None:
        """Copies whose source and destination are both this rank."""
        for t in self.plan.rounds[i][self.rank].local:
            self._dst_view(t).copy_(
                self._src[t.src_tensor][t.src_row : t.src_row + t.rows, t.src_col : t.src_col + t.cols]
            )

    def finish(self, i: int, send: torch.Tensor, recv: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        """Unpack the receive buffer, free the buffers, return the tensors completed in this round."""
        rr = self.plan.rounds[i][self.rank]
        off = 0
        for pieces in rr.recvs.values() if recv.numel() else ():
            for t in pieces:
                self._dst_view(t).copy_(recv[off : off + t.numel].view(t.rows, t.cols))
                off += t.numel
        self.meter.add(buffers=-(send.numel() + recv.numel()) * send.element_size())
        done = []
        names = self.plan.dst.ranks[self.rank]
        for ti in rr.complete:
            t = self._dst.pop(ti)
            t = self._given.pop(ti, t)
            if names[ti].name not in self._out:
                self.meter.add(outputs=-t.numel() * t.element_size())
            done.append((names[ti].name, t))
        return done


def torch_all_to_all(group: object | None = None) -> AllToAll:
    """``all_to_all_single`` over ``group`` (bytes on the wire, so any dtype works on any backend)."""
    import torch.distributed as dist

    def run(recv: torch.Tensor, send: torch.Tensor, out_splits: list[int], in_splits: list[int]) -> object:
        k = send.element_size()
        return dist.all_to_all_single(
            recv.view(torch.uint8),
            send.view(torch.uint8),
            [s * k for s in out_splits],
            [s * k for s in in_splits],
            group=group,
            async_op=True,
        )

    return run


def run_rank(executor: RankExecutor, all_to_all: AllToAll | None) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Run every round on this rank; yields the finished (name, tensor) list of each non-empty round."""
    plan = executor.plan
    for i in range(len(plan.rounds)):
        send, in_splits, recv, out_splits = executor.start(i)
        work = None
        if plan.comm_rounds[i]:
            if all_to_all is None:
                raise RunError(
                    f"reshard rank {executor.rank}: round {i} needs a collective but none was given"
                )
            work = all_to_all(recv, send, out_splits, in_splits)
        executor.local(i)
        if work is not None:
            work.wait()
        done = executor.finish(i, send, recv)
        del send, recv
        if done:
            yield done


def run_rank_p2p(
    executor: RankExecutor, group: object | None = None
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Same plan, sent as point-to-point messages per piece (``batch_isend_irecv``).

    Contiguous pieces go straight from the source tensor and into the destination tensor (no pack or
    unpack copy); only column slices are staged through temporaries, which the plan's bucket bounds.
    """
    import torch.distributed as dist

    plan, rank = executor.plan, executor.rank

    def peer(r: int) -> int:
        return dist.get_global_rank(group, r) if group is not None else r

    for i in range(len(plan.rounds)):
        rr = plan.rounds[i][rank]
        for ti in rr.allocate:
            executor._alloc(ti)
        ops, staged, staged_bytes = [], [], 0
        for d, pieces in rr.sends.items():
            for t in pieces:
                src = executor._src[t.src_tensor][
                    t.src_row : t.src_row + t.rows, t.src_col : t.src_col + t.cols
                ]
                if not src.is_contiguous():
                    src = src.contiguous()
                    staged_bytes += src.numel() * src.element_size()
                ops.append(dist.P2POp(dist.isend, src, peer(d), group))
        for s, pieces in rr.recvs.items():
            for t in pieces:
                dst = executor._dst_view(t)
                if not dst.is_contiguous():
                    buf = torch.empty((t.rows, t.cols), dtype=executor.dtype, device=executor.device)
                    staged.append((dst, buf))
                    staged_bytes += buf.numel() * buf.element_size()
                    dst = buf
                ops.append(dist.P2POp(dist.irecv, dst, peer(s), group))
        executor.meter.add(buffers=staged_bytes)
        works = dist.batch_isend_irecv(ops) if ops else []
        executor.local(i)
        for w in works:
            w.wait()
        for dst, buf in staged:
            dst.copy_(buf)
        del ops, staged
        executor.meter.add(buffers=-staged_bytes)
        empty = torch.empty(0, dtype=executor.dtype)
        done = executor.finish(i, empty, empty)  # nothing left to unpack: only hands back finished tensors
        if done:
            yield done
