"""Rows an update need not forward: those the caller knows add exactly nothing to the loss or its
gradient (a policy-gradient loss on a sequence whose advantage is 0 at every token, a padding row).

They still count in the mini-batch's loss totals (:class:`rlctl.engines.optim.LossScale`, taken
before they are dropped), so every other row's share, and thus the gradient, is unchanged. The
engine forwards the rest; where a rank is left with fewer micro-batches than another (FSDP's
forwards are collectives) or with none, it runs a *fill* row instead: a copy of one row with an
all-zero ``response_mask``, whose loss and gradient are exactly zero.
"""

from __future__ import annotations

import torch

Batch = dict[str, torch.Tensor]


def fill_row(batch: Batch) -> Batch:
    """The batch's first row with its ``response_mask`` zeroed: it runs and adds nothing."""
    row = {k: v[:1] for k, v in batch.items()}
    row["response_mask"] = torch.zeros_like(row["response_mask"])
    return row


def trained_rows(batch: Batch, skip_rows: torch.Tensor | None) -> tuple[Batch, Batch | None]:
    """``batch`` without the rows ``skip_rows`` marks, and the fill row (None: nothing skipped,
    the batch as given)."""
    if skip_rows is None:
        return batch, None
    keep = ~skip_rows.to(torch.bool)
    if len(keep) != len(batch["response_mask"]):
        raise ValueError(f"skip_rows has {len(keep)} rows for a batch of {len(batch['response_mask'])}")
    return {k: v[keep] for k, v in batch.items()}, fill_row(batch)
