"""Mixed precision of the training engine: fp32 master weights, bf16/fp16 compute, fp16 loss scaling.

The engine stores parameters, gradients and AdamW state in ``dtype`` (fp32 for trained models) and
computes in ``mixed_precision``:

* under ``torch.distributed`` FSDP2's ``MixedPrecisionPolicy(param_dtype=compute,
  reduce_dtype=float32)`` casts the all-gathered parameters to the compute dtype for forward and
  backward and reduce-scatters the gradients in fp32 into the fp32 shards;
* on one process without ``torch.distributed`` ``torch.autocast`` runs matmuls/attention in the
  compute dtype on the fp32 parameters; the casts are differentiable, so gradients reach the fp32
  parameters in fp32. Norms and embeddings stay fp32 there (autocast's op lists), so the numbers
  differ from the FSDP2 path by bf16 rounding, not in kind.

Logits are cast to fp32 before ``log_softmax`` (:mod:`rlctl.engines.logprob`) and the critic's value
head runs in fp32 (:class:`rlctl.engines.hf_model.ValueHeadModel`).

fp16 has five exponent bits: small gradients underflow to zero, so fp16 compute trains with a
dynamic loss scale (:class:`DynamicLossScaler`, the scheme of ``torch.amp.GradScaler``: scale the
loss, unscale the gradients, skip the step and halve the scale on inf/nan, double it after
``growth_interval`` clean steps). bf16 has fp32's exponent range and needs none.
"""

from __future__ import annotations

import contextlib

import torch

from rlctl.engines.hf_model import resolve_dtype
from rlctl.errors import UserError


def compute_dtype(
    storage: str | torch.dtype, mixed_precision: str | torch.dtype | None
) -> torch.dtype | None:
    """The compute dtype when it differs from the storage dtype, else None (no mixed precision).

    Mixed precision only makes sense over fp32 storage; a low-precision compute dtype over a
    low-precision storage dtype is refused so a config cannot silently train in pure bf16/fp16.
    """
    if mixed_precision is None:
        return None
    store, comp = resolve_dtype(storage), resolve_dtype(mixed_precision)
    if comp == store:
        return None
    if store != torch.float32:
        raise UserError(
            f"mixed_precision={mixed_precision!r} over dtype={storage!r}: mixed precision keeps fp32 master "
            "weights; expected dtype='float32' (or mixed_precision=None)"
        )
    if comp == torch.float32:
        return None
    return comp


def autocast(device: torch.device, dtype: torch.dtype | None, distributed: bool):
    """``torch.autocast`` in ``dtype`` for the one-process path; disabled under FSDP2 (its policy casts)."""
    if dtype is not None and not distributed:
        return torch.autocast(device.type, dtype=dtype)
    if device.type in ("cpu", "cuda", "xpu", "mps", "hpu", "npu", "xla"):
        return torch.autocast(device.type, enabled=False)
    return contextlib.nullcontext()


class DynamicLossScaler:
    """Loss scale for fp16 compute: ``scale`` the loss, ``unscale_`` the grads, ``update`` after the step.

    Works on plain tensors and on FSDP2's DTensor gradients alike (only in-place ``mul_``); the
    engine's existing non-finite grad-norm check is the overflow detector.
    """

    def __init__(
        self,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        min_scale: float = 1.0,
    ):
        self.scale = float(init_scale)
        self.growth_factor = growth_factor
        self.backoff_factor = backoff_factor
        self.growth_interval = growth_interval
        self.min_scale = min_scale
        self.good_steps = 0

    def unscale_(self, params) -> None:
        inv = 1.0 / self.scale
        with torch.no_grad():
            for p in params:
                if p.grad is not None:
                    p.grad.mul_(inv)

    def update(self, found_inf: bool) -> None:
        """Halve on overflow (the step was skipped), grow after ``growth_interval`` clean steps."""
        if found_inf:
            self.scale = max(self.min_scale, self.scale * self.backoff_factor)
            self.good_steps = 0
            return
        self.good_steps += 1
        if self.good_steps >= self.growth_interval:
            self.scale *= self.growth_factor
            self.good_steps = 0

    def state_dict(self) -> dict:
        return {"scale": self.scale, "good_steps": self.good_steps}

    def load_state_dict(self, state: dict) -> None:
        self.scale = float(state["scale"])
        self.good_steps = int(state["good_steps"])
