"""Masked reductions with verl's conventions (``verl.utils.torch_functional``).

- ``masked_mean`` divides by ``mask.sum() + 1e-8`` (so an empty mask gives 0, not NaN).
- ``masked_var`` is the unbiased (Bessel-corrected) variance and raises when fewer than two
  elements are selected, as verl does.
- ``masked_whiten`` is ``(x - mean) * rsqrt(var + 1e-8)``: the eps sits inside the rsqrt.
"""

from __future__ import annotations

import torch


def masked_sum(
    values: torch.Tensor, mask: torch.Tensor, dim: int | None = None, *, axis: int | None = None
) -> torch.Tensor:
    """Sum of ``values`` where ``mask`` is non-zero; NaN/inf outside the mask never leak in.

    ``axis`` is accepted as verl's spelling of ``dim``.
    """
    dim = axis if dim is None else dim
    valid = torch.where(mask.bool(), values, torch.zeros((), dtype=values.dtype, device=values.device))
    return (valid * mask).sum() if dim is None else (valid * mask).sum(dim=dim)


def masked_mean(
    values: torch.Tensor, mask: torch.Tensor, dim: int | None = None, *, axis: int | None = None
) -> torch.Tensor:
    """verl's masked mean: ``masked_sum / (mask.sum() + 1e-8)`` (``axis`` = verl's name for ``dim``)."""
    dim = axis if dim is None else dim
    count = mask.sum() if dim is None else mask.sum(dim=dim)
    return masked_sum(values, mask, dim) / (count + 1e-8)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance over the masked elements, unbiased by default (verl's ``masked_var``)."""
    mean = masked_mean(values, mask)
    var = masked_mean((values - mean) ** 2, mask)
    if unbiased:
        n = mask.sum()
        if n == 0:
            raise ValueError("masked_var: the mask selects no element (need at least 2)")
        if n == 1:
            raise ValueError("masked_var: the mask selects one element; unbiased variance needs at least 2")
        var = var * (n / (n - 1))
    return var


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """verl's whitening: ``(x - mean) * rsqrt(var_unbiased + 1e-8)``; ``shift_mean=False`` re-adds the mean."""
    mean, var = masked_mean(values, mask), masked_var(values, mask)
    whitened = (values - mean) * torch.rsqrt(var + 1e-8)
    if not shift_mean:
        whitened = whitened + mean
    return whitened


def compute_response_mask(attention_mask: torch.Tensor, response_length: int) -> torch.Tensor:
    """The response part of a (prompt + response) attention mask: its last ``response_length`` columns."""
    return attention_mask[:, -response_length:]


def response_mask_from_ids(
    response_ids: torch.Tensor, eos_token_id: int | list[int], dtype: torch.dtype = torch.int64
) -> torch.Tensor:
    """1 up to and including the first EOS of each row, 0 after it (verl's ``get_response_mask``)."""
    eos = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
    is_eos = torch.isin(response_ids, torch.tensor(eos, device=response_ids.device))
    # tokens strictly after the first EOS have a positive count of EOS before them
    after = (is_eos.cumsum(dim=1) - is_eos.long()) > 0
    return (~after).to(dtype)
