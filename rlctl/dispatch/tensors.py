"""Tensor plumbing for DataProto: compact pickling, borrowed unpickling, fast row concatenation."""

from __future__ import annotations

import contextlib
import contextvars
import warnings
from collections.abc import Iterator

import numpy as np
import torch


def pack_tensor(t: torch.Tensor) -> tuple:
    """A picklable form of ``t`` that carries only its own bytes (no shared storage)."""
    t = t.detach()
    if t.device.type != "cpu":
        return ("torch", t.contiguous())  # device tensors: let torch pickle them
    t = t.contiguous()
    if t.dtype == torch.bfloat16:  # numpy has no bfloat16: travel as int16 bit patterns
        return ("bf16", t.view(torch.int16).numpy())
    try:
        return ("np", t.numpy())
    except (TypeError, RuntimeError):  # dtypes numpy cannot view (e.g. float8): let torch pickle them
        return ("torch", t.clone())


_BORROW = contextvars.ContextVar("rlctl_dataproto_borrow", default=False)


@contextlib.contextmanager
def borrowing() -> Iterator[None]:
    """Unpickle DataProtos without copying their tensors out of the (read-only) source buffers.

    Only for code that copies right after, like the driver's collect (``concat`` always allocates
    when a part is borrowed); the borrowed parts must not be handed to user code.
    """
    token = _BORROW.set(True)
    try:
        yield
    finally:
        _BORROW.reset(token)


def unpack_tensor(packed: tuple, borrow: bool) -> torch.Tensor:
    kind = packed[0]
    if kind == "torch":
        return packed[1]
    if borrow:
        with warnings.catch_warnings():  # non-writable numpy: fine, nobody writes before concat copies
            warnings.simplefilter("ignore", UserWarning)
            t = torch.from_numpy(packed[1])
    else:
        t = torch.from_numpy(np.array(packed[1], copy=True))  # own, writable memory (see module docstring)
    return t.view(torch.bfloat16) if kind == "bf16" else t


def cat_rows(tensors: list[torch.Tensor]) -> torch.Tensor:
    """torch.cat, through numpy for plain CPU tensors (np.concatenate is ~3x faster there: a memcpy)."""
    t0 = tensors[0]
    if t0.device.type != "cpu" or any(t.requires_grad or t.dtype != t0.dtype for t in tensors):
        return torch.cat(tensors)
    try:
        if t0.dtype == torch.bfloat16:
            arrs = [t.view(torch.int16).numpy() for t in tensors]
            return torch.from_numpy(np.concatenate(arrs)).view(torch.bfloat16)
        return torch.from_numpy(np.concatenate([t.numpy() for t in tensors]))
    except (
        TypeError,
        RuntimeError,
        ValueError,
    ):  # dtypes numpy cannot view, or shape mismatch: let torch say
        return torch.cat(tensors)
