"""Checkpoint files read without running code from them.

A pickle runs whatever callables it names, so a crafted ``driver.pt`` or DCP ``.metadata`` would
run code on ``--resume``. Everything rlctl loads from a checkpoint goes through one of:

- :func:`safe_torch_load`: ``torch.load(weights_only=True)`` (torch's own allow-list: tensors,
  containers, numbers, strings), plus the numpy RNG-state types older checkpoints hold;
- :func:`check_dcp_metadata`: the ``.metadata`` pickle unpickled first by an allow-list of the
  classes torch's DCP writes (``torch/distributed/checkpoint/metadata.py``, ``filesystem.py``
  ``_StorageInfo``, dtypes, ``torch.Size``, paths), before DCP's own ``pickle.load`` reads it;
- :class:`SafeLoadPlanner`: DCP's default planner, whose ``load_bytes`` (non-tensor state such as
  optimizer param groups) calls ``torch.load(weights_only=False)`` in torch 2.13
  (``torch/distributed/checkpoint/default_planner.py``); here those bytes must pass
  ``weights_only=True`` first.

A file that names anything else is refused in one line (:class:`~rlctl.errors.CheckpointRefused`).
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.distributed.checkpoint import DefaultLoadPlanner

from rlctl.errors import CheckpointRefused, UserError

DCP_METADATA = ".metadata"
_DCP_MODULES = ("torch.distributed.checkpoint.metadata",)
_ALLOWED = {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
    ("pathlib", "WindowsPath"),
    ("pathlib", "PureWindowsPath"),
    ("collections", "OrderedDict"),
    ("builtins", "set"),
    ("builtins", "frozenset"),
}
# what numpy's RNG state (``np.random.get_state()``) pickles to, in checkpoints before format 3
_NUMPY_STATE = [np.ndarray, np.dtype, np.dtypes.UInt32DType]
try:
    from numpy._core.multiarray import _reconstruct
except ImportError:  # numpy < 2
    from numpy.core.multiarray import _reconstruct
_NUMPY_STATE.append(_reconstruct)


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        allowed = (module, name) in _ALLOWED or module in _DCP_MODULES
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            allowed = True
        if not allowed:
            raise pickle.UnpicklingError(f"it names {module}.{name}, which a DCP checkpoint never holds")
        return super().find_class(module, name)


def check_dcp_metadata(directory: Path) -> None:
    """UserError unless ``directory/.metadata`` unpickles with only the classes DCP writes."""
    path = directory / DCP_METADATA
    try:
        with open(path, "rb") as f:
            _MetadataUnpickler(f).load()
    except FileNotFoundError as exc:
        raise UserError(f"checkpoint {directory}: no {DCP_METADATA} (not a complete checkpoint)") from exc
    except Exception as exc:
        raise CheckpointRefused(f"checkpoint {path}: refused, not loaded ({exc})") from exc


def safe_torch_load(path: Path) -> Any:
    """``torch.load`` of a checkpoint file that can hold data only; UserError naming the file if not."""
    try:
        with torch.serialization.safe_globals(_NUMPY_STATE):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointRefused(
            f"checkpoint {path}: refused, not loaded (holds more than data: {first})"
        ) from exc


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner, with every non-tensor item checked by ``weights_only=True``."""

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        data = value.getvalue()
        try:
            torch.load(io.BytesIO(data), weights_only=True)
        except pickle.UnpicklingError as exc:
            raise CheckpointRefused(
                f"checkpoint item {read_item.dest_index.fqn!r}: refused, not loaded (holds more than data)"
            ) from exc
        super().load_bytes(read_item, io.BytesIO(data))
