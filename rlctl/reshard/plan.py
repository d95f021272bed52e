"""Planner: which rank sends which block to whom, grouped into size-bounded rounds (buckets).

Given a source and a destination :class:`~rlctl.reshard.layout.Layout` over the same ranks, every
destination block is cut into pieces, each taken from one source rank that holds it (the rank itself
when it can, else a holder picked round-robin so replicated sources share the load). Pieces whose
source and destination are the same rank are local copies and need no buffer; the others go through
one ``all_to_all`` per round. Rounds are filled greedily in destination-tensor order so that, on every
rank, send bytes + receive bytes of a round stay within ``bucket_bytes``; a destination tensor is
complete (and can be handed to the consumer) after the last round that writes it.

The plan is a pure function of its inputs, so every rank computes the same one without talking.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from rlctl.errors import UserError
from rlctl.reshard.layout import Layout


@dataclass(frozen=True)
class Transfer:
    """Copy ``rows x cols`` from local tensor ``src_tensor`` of rank ``src`` (2-D view, at
    ``src_row, src_col``) into local tensor ``dst_tensor`` of rank ``dst`` (at ``dst_row, dst_col``)."""

    src: int
    src_tensor: int
    src_row: int
    src_col: int
    dst: int
    dst_tensor: int
    dst_row: int
    dst_col: int
    rows: int
    cols: int

    @property
    def numel(self) -> int:
        return self.rows * self.cols


@dataclass
class RankRound:
    """What one rank does in one round."""

    sends: dict[int, list[Transfer]] = field(default_factory=dict)  # dst rank -> pieces, in order
    recvs: dict[int, list[Transfer]] = field(default_factory=dict)  # src rank -> pieces, in order
    local: list[Transfer] = field(default_factory=list)
    allocate: list[int] = field(default_factory=list)  # dst tensor indices first written here
    complete: list[int] = field(default_factory=list)  # dst tensor indices finished after this round

    def send_numel(self) -> int:
        return sum(t.numel for ts in self.sends.values() for t in ts)

    def recv_numel(self) -> int:
        return sum(t.numel for ts in self.recvs.values() for t in ts)


@dataclass
class Plan:
    """A full reshard plan: ``rounds[i][rank]`` is what ``rank`` does in round ``i``."""

    src: Layout
    dst: Layout
    itemsize: int
    bucket_bytes: int
    rounds: list[list[RankRound]]
    comm_rounds: list[bool]  # whether round i moves anything between ranks (else no collective)

    @property
    def world(self) -> int:
        return self.src.world

    def bytes_moved(self) -> int:
        """Bytes that cross ranks (sum over ranks of bytes sent)."""
        return sum(rr.send_numel() for rnd in self.rounds for rr in rnd) * self.itemsize

    def bytes_local(self) -> int:
        return sum(t.numel for rnd in self.rounds for rr in rnd for t in rr.local) * self.itemsize

    def max_round_comm_bytes(self, rank: int) -> int:
        return max(
            ((rnd[rank].send_numel() + rnd[rank].recv_numel()) * self.itemsize for rnd in self.rounds),
            default=0,
        )


def _overlap(a0: int, a1: int, b0: int, b1: int) -> tuple[int, int]:
    return max(a0, b0), min(a1, b1)


def _source_index(
    src: Layout,
) -> dict[str, list[tuple[tuple[int, int, int, int], list[tuple[int, int, int]]]]]:
    """HF param -> distinct source rectangles, each with its holders ``(rank, tensor index, local row)``."""
    by_param: dict[str, dict[tuple[int, int, int, int], list[tuple[int, int, int]]]] = defaultdict(dict)
    for rank, tensors in enumerate(src.ranks):
        for ti, t in enumerate(tensors):
            for b in t.blocks:
                rect = (b.row0, b.row1, b.col0, b.col1)
                by_param[b.param].setdefault(rect, []).append((rank, ti, b.at))
    index = {}
    for param, rects in by_param.items():
        items = sorted(rects.items())
        for i, ((r0, r1, c0, c1), _) in enumerate(items):
            for (s0, s1, d0, d1), _h in items[i + 1 :]:
                rows, cols = _overlap(r0, r1, s0, s1), _overlap(c0, c1, d0, d1)
                if rows[1] > rows[0] and cols[1] > cols[0]:
                    raise ValueError(f"{src.kind}: blocks of {param} overlap partially; cannot pick a source")
        index[param] = items
    return index


def _pieces(src: Layout, dst: Layout) -> list[list[list[Transfer]]]:
    """``pieces[rank][dst tensor index]`` = transfers that fill it, in order."""
    if src.world != dst.world:
        raise UserError(f"reshard: {src.kind} has {src.world} ranks but {dst.kind} has {dst.world}")
    index = _source_index(src)
    out: list[list[list[Transfer]]] = []
    for rank, tensors in enumerate(dst.ranks):
        per_tensor = []
        for ti, t in enumerate(tensors):
            pieces: list[Transfer] = []
            for b in t.blocks:
                covered = 0
                for (r0, r1, c0, c1), holders in index.get(b.param, []):
                    ra, rb = _overlap(r0, r1, b.row0, b.row1)
                    ca, cb = _overlap(c0, c1, b.col0, b.col1)
                    if rb <= ra or cb <= ca:
                        continue
                    mine = [h for h in holders if h[0] == rank]
                    s_rank, s_ti, s_at = mine[0] if mine else holders[rank % len(holders)]
                    pieces.append(
                        Transfer(
                            s_rank,
                            s_ti,
                            s_at + ra - r0,
                            ca - c0,
                            rank,
                            ti,
                            b.at + ra - b.row0,
                            ca - b.col0,
                            rb - ra,
                            cb - ca,
                        )
                    )
                    covered += (rb - ra) * (cb - ca)
                if covered != b.rows * b.cols:
                    raise UserError(
                        f"reshard: {src.kind} does not hold all of {b.param} rows {b.row0}:{b.row1} "
                        f"cols {b.col0}:{b.col1} needed by {dst.kind} rank {rank}"
                    )
            per_tensor.append(pieces)
        out.append(per_tensor)
    return out


def _split(t: Transfer, max_numel: int) -> list[Transfer]:
    if t.numel <= max_numel:
        return [t]
    step = max_numel // t.cols
    return [
        Transfer(
            t.src,
            t.src_tensor,
            t.src_row + i,
            t.src_col,
            t.dst,
            t.dst_tensor,
            t.dst_row + i,
            t.dst_col,
            min(step, t.rows - i),
            t.cols,
        )
        for i in range(0, t.rows, step)
    ]


def make_plan(src: Layout, dst: Layout, itemsize: int, bucket_bytes: int) -> Plan:
    """Plan the move from ``src`` to ``dst`` with at most ``bucket_bytes`` of send+recv buffers per rank
    per round. ``bucket_bytes`` must hold at least one row of the widest tensor that crosses ranks."""
    pieces = _pieces(src, dst)
    world = dst.world
    max_numel = bucket_bytes // itemsize
    rounds: list[list[RankRound]] = [[RankRound() for _ in range(world)]]
    comm = [0] * world
    comm_rounds = [False]
    first: dict[tuple[int, int], int] = {}
    last: dict[tuple[int, int], int] = {}
    depth = max((len(t) for t in dst.ranks), default=0)
    for ti in range(depth):
        for rank in range(world):
            if ti >= len(pieces[rank]):
                continue
            first[(rank, ti)] = len(rounds) - 1
            for piece in pieces[rank][ti]:
                if piece.src == piece.dst:
                    rounds[-1][rank].local.append(piece)
                    continue
                if piece.cols > max_numel:
                    raise UserError(
                        f"reshard: bucket_bytes={bucket_bytes} is smaller than one row "
                        f"({piece.cols * itemsize} bytes) of {dst.ranks[rank][ti].name}"
                    )
                for part in _split(piece, max_numel):
                    n = part.numel
                    if comm[part.src] + n > max_numel or comm[part.dst] + n > max_numel:
                        rounds.append([RankRound() for _ in range(world)])
                        comm_rounds.append(False)
                        comm = [0] * world
                    rounds[-1][part.src].sends.setdefault(part.dst, []).append(part)
                    rounds[-1][part.dst].recvs.setdefault(part.src, []).append(part)
                    comm[part.src] += n
                    comm[part.dst] += n
                    comm_rounds[-1] = True
            last[(rank, ti)] = len(rounds) - 1
    for (rank, ti), i in first.items():
        rounds[i][rank].allocate.append(ti)
    for (rank, ti), i in last.items():
        rounds[i][rank].complete.append(ti)
    for rnd in rounds:
        for rr in rnd:
            rr.sends = dict(sorted(rr.sends.items()))
            rr.recvs = dict(sorted(rr.recvs.items()))
    return Plan(src, dst, itemsize, bucket_bytes, rounds, comm_rounds)
