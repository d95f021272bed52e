"""Loss aggregation (verl's ``agg_loss``) with an exact gradient-accumulation contract.

Modes:
- ``token-mean``: masked token sum / number of valid tokens.
- ``seq-mean-token-sum``: per-sequence token sum, mean over non-empty sequences.
- ``seq-mean-token-mean``: per-sequence token mean, mean over non-empty sequences.
- ``seq-mean-token-sum-norm``: per-sequence token sum / ``norm_constant`` (default: the padded
  response length, ``loss_mask.shape[-1]``), mean over non-empty sequences (Dr.GRPO).

Micro-batching contract. The training engine splits a mini-batch into micro-batches (and over DP
ranks), calls the loss on each and sums the gradients; FSDP then averages over DP ranks. It passes
the mini-batch-wide totals from :func:`batch_totals` summed over all micro-batches and DP ranks
(``global_tokens``, ``global_seqs``) plus ``dp_size``. With those, each call returns this
micro-batch's contribution ``local_sum / global_count * dp_size`` so that the sum over micro-batches,
averaged over ranks, equals the full mini-batch value exactly, for any split. Without them it is the
plain local aggregation (same numbers as verl with no global info).

Where this differs from verl, deliberately:
- ``global_seqs`` counts only sequences with at least one valid token, the same set the local
  seq-mean averages over. verl passes the mini-batch size (empty rows included) as
  ``global_batch_size``, so with empty rows its micro-batched loss differs from its full-batch one.
- An all-empty mask gives 0 (with a gradient path) instead of verl's 0/0 = NaN.
- For ``seq-mean-token-sum-norm`` with micro-batches padded to different lengths, pass
  ``norm_constant`` (e.g. the max response length); the default follows each micro-batch's width.
"""

from __future__ import annotations

import torch

from rlctl.algorithms.masked import masked_sum
from rlctl.errors import UserError

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def batch_totals(loss_mask: torch.Tensor) -> dict[str, int]:
    """This batch's share of the totals ``agg_loss`` needs: valid tokens and non-empty sequences.

    Sum these over micro-batches and DP ranks (all-reduce) to get ``global_tokens``/``global_seqs``.
    """
    return {
        "global_tokens": int(loss_mask.sum().item()),
        "global_seqs": int((loss_mask.sum(dim=-1) > 0).sum().item()),
    }


def _divide(total: torch.Tensor, count: torch.Tensor | float | int) -> torch.Tensor:
    """``total / count`` where a zero count (so a zero total) gives 0 rather than NaN."""
    if isinstance(count, torch.Tensor):
        return total / count.to(total.dtype).clamp(min=1)
    return total / max(float(count), 1.0)


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    mode: str = "token-mean",
    *,
    global_tokens: int | float | torch.Tensor | None = None,
    global_seqs: int | float | torch.Tensor | None = None,
    dp_size: int = 1,
    norm_constant: float | None = None,
) -> torch.Tensor:
    """Aggregate a (batch, len) loss matrix to a scalar; see the module docstring for the contract."""
    mask = loss_mask.to(loss_mat.dtype)
    if mode == "token-mean":
        if global_tokens is None:
            if dp_size > 1:
                raise ValueError("agg_loss: token-mean with dp_size > 1 needs global_tokens")
            global_tokens = mask.sum()
        return _divide(masked_sum(loss_mat, mask), global_tokens) * dp_size
    if mode in ("seq-mean-token-sum", "seq-mean-token-sum-norm", "seq-mean-token-mean"):
        tokens_per_seq = mask.sum(dim=-1)
        seq_mask = (tokens_per_seq > 0).to(loss_mat.dtype)
        seq_losses = masked_sum(loss_mat, mask, dim=-1)
        if mode == "seq-mean-token-mean":
            seq_losses = seq_losses / (tokens_per_seq + 1e-8)
        if global_seqs is None:
            if dp_size > 1:
                raise ValueError(f"agg_loss: {mode} with dp_size > 1 needs global_seqs")
            global_seqs = seq_mask.sum()
        loss = _divide(masked_sum(seq_losses, seq_mask), global_seqs) * dp_size
        if mode == "seq-mean-token-sum-norm":
            loss = loss / (norm_constant if norm_constant is not None else loss_mask.shape[-1])
        return loss
    raise UserError(f"unknown loss_agg_mode {mode!r}; expected one of: {', '.join(LOSS_AGG_MODES)}")
