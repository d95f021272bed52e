"""The driver-side mini-batch layout of an update: the same optimiser steps on any number of ranks.

A step's rows are ordered by prompt group (the n samples of one prompt are adjacent, sharing a
``uid``). The driver cuts them into mini-batches of ``prompts_per_mini_batch`` whole groups
(verl's ``ppo_mini_batch_size``, counted in prompts; the last one may hold fewer), which depends
only on the batch, never on the world size. Each mini-batch is then split over the DP ranks,
padded to a multiple of the DP size with copies of its first rows that are marked in the
``PADDING`` column (the workers zero their ``response_mask``, so they add nothing to any loss,
count or metric). The rows are reordered rank-major, so the plain DP split of the dispatch hands
rank r exactly ``[mini-batch 0 part r | mini-batch 1 part r | ...]``, and
``meta[MINI_BATCH_ROWS]`` tells every rank where its parts end. One and two ranks thus take the
same optimiser steps on the same rows, and gradients agree to float rounding.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from rlctl.dispatch import DataProto
from rlctl.dispatch.proto import PADDING

MINI_BATCH_ROWS = "mini_batch_rows"  # meta: rows per rank of each mini-batch, in order


def group_starts(uids: np.ndarray | None, rows: int) -> list[int]:
    """Start row of each run of equal ``uid`` (each row its own group without uids)."""
    if uids is None:
        return list(range(rows))
    if len(uids) != rows:
        raise ValueError(f"{len(uids)} uids for {rows} rows")
    return [i for i in range(rows) if i == 0 or uids[i] != uids[i - 1]]


def cut_mini_batches(uids: np.ndarray | None, rows: int, prompts_per_mini_batch: int) -> list[range]:
    """Consecutive row ranges of ``prompts_per_mini_batch`` whole prompt groups each (0: one range)."""
    if rows == 0:
        return []
    starts = group_starts(uids, rows)
    per = prompts_per_mini_batch if prompts_per_mini_batch > 0 else len(starts)
    bounds = [*starts[::per], rows]
    return [range(a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def layout_mini_batches(
    batch: DataProto, uids: np.ndarray | None, prompts_per_mini_batch: int, dp_size: int
) -> DataProto:
    """``batch`` laid out for an update over ``dp_size`` ranks (see the module docstring)."""
    if dp_size < 1:
        raise ValueError(f"dp_size must be >= 1, got {dp_size}")
    pieces: list[list[torch.Tensor]] = [[] for _ in range(dp_size)]
    pads: list[list[torch.Tensor]] = [[] for _ in range(dp_size)]
    per_rank: list[int] = []
    base = batch.padding_mask()
    for rows in cut_mini_batches(uids, len(batch), prompts_per_mini_batch):
        size = -(-len(rows) // dp_size)
        idx = torch.tensor(list(rows), dtype=torch.long)
        extra = size * dp_size - len(rows)
        # padding: copies of the mini-batch's first rows (cycling), so shapes and dtypes stay valid
        idx = torch.cat([idx, idx[torch.arange(extra) % len(rows)]])
        pad = torch.cat([base[idx[: len(rows)]], torch.ones(extra, dtype=torch.bool)])
        for r in range(dp_size):
            pieces[r].append(idx[r * size : (r + 1) * size])
            pads[r].append(pad[r * size : (r + 1) * size])
        per_rank.append(size)
    if not per_rank:
        out = batch[:0]
        out.meta[MINI_BATCH_ROWS] = []
        return out
    order = torch.cat([torch.cat(p) for p in pieces])
    out = batch[order]
    if PADDING in batch.batch or len(order) > len(batch):
        out.batch[PADDING] = torch.cat([torch.cat(p) for p in pads])
    out.meta[MINI_BATCH_ROWS] = per_rank
    return out


def split_mini_batches(
    batch: dict[str, torch.Tensor], rows_per_mini_batch: Sequence[int] | None
) -> list[dict[str, torch.Tensor]]:
    """This rank's share cut at the sizes ``layout_mini_batches`` recorded (None: one mini-batch)."""
    n = next(iter(batch.values())).shape[0]
    sizes = list(rows_per_mini_batch) if rows_per_mini_batch is not None else [n]
    if sum(sizes) != n or any(s < 1 for s in sizes):
        raise ValueError(
            f"meta[{MINI_BATCH_ROWS!r}]={sizes} does not cut this rank's {n} rows; lay the batch out "
            "with rlctl.trainer.step.minibatch.layout_mini_batches for this group's DP size"
        )
    out, start = [], 0
    for s in sizes:
        out.append({k: v[start : start + s] for k, v in batch.items()})
        start += s
    return out
