"""Rows an update need not forward: those the caller knows add exactly nothing to the loss or its
gradient (a policy-gradient loss on a sequence whose advantage is 0 at every token, a padding row).

They still count in the mini-batch's loss totals (:class:`rlctl.engines.optim.LossScale`, taken
before they are dropped), so every other row's share, and thus the gradient, is unchanged. The
engine forwards the rest; where a rank is left with fewer micro-batches than another (FSDP's
forwards are collectives) or with none, it runs a *fill* row instead: a copy of one row with an
all-zero ``response_mask``, whose loss and gradient are exactly zero.

The update's metrics stay those of the whole batch: the skipped rows that have loss tokens
(:func:`skipped_rows`) run one forward without grad, and the loss's metrics of them are counted
(their ``pg_loss`` share is exactly 0; ``ppo_kl``, entropy, the clip fractions and the log-prob gap
need the current policy's log-probs). That forward costs about a third of the forward and backward
skipped. :func:`skipped_share` is ``zero_grad_row_frac``'s parts: skipped rows among the rows with
loss tokens, summed over ranks like every other part.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rlctl.algorithms.metric_parts import Mean
from rlctl.engines.batch_metrics import BatchMetrics
from rlctl.engines.optim import LossScale

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


def skipped_rows(batch: Batch, skip_rows: torch.Tensor | None) -> Batch | None:
    """The rows ``skip_rows`` marks that have loss tokens (None: nothing skipped)."""
    if skip_rows is None:
        return None
    rows = skip_rows.to(torch.bool) & (batch["response_mask"].sum(-1) > 0)
    return {k: v[rows] for k, v in batch.items()}


def skipped_share(batch: Batch, skip_rows: torch.Tensor | None) -> Mean:
    """Parts of ``zero_grad_row_frac``: skipped rows / rows with loss tokens (padding rows count
    in neither)."""
    live = batch["response_mask"].sum(-1) > 0
    skipped = 0.0 if skip_rows is None else float((skip_rows.to(torch.bool) & live).sum())
    return Mean(skipped, float(live.sum()))


@torch.no_grad()
def measure_skipped(
    micro_batches: list[Batch],
    forward: Callable[..., Batch],
    loss_fn: Callable[..., tuple[torch.Tensor, dict]],
    scale: LossScale,
    parts: BatchMetrics,
    device: torch.device,
    temperature: float,
    with_entropy: bool,
) -> float:
    """Add to ``parts`` the loss's metrics of the skipped rows' ``micro_batches`` (fill rows
    included, which add nothing), each from one ``forward`` without grad in the update's mode; the
    loss itself is dropped. Returns the tokens forwarded."""
    tokens = 0.0
    for mb in micro_batches:
        tokens += float(mb["attention_mask"].sum())
        outputs = forward(mb, temperature=temperature, with_entropy=with_entropy)
        _, metrics = loss_fn(outputs, {k: v.to(device) for k, v in mb.items()}, scale)
        parts.add(metrics)
    return tokens
