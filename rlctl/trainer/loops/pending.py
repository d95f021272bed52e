"""Batches generated but not yet trained, kept in a checkpoint so a resumed run trains the same ones.

one_step_off generates batch ``s + 1`` with the weights *before* step ``s``'s update; a checkpoint
after step ``s`` holds only the weights after it, so that batch cannot be generated again on
resume. It is written beside the roles' shards instead: tensors as safetensors (no pickle), the
non-tensor columns, meta and the rollout stage's figures as JSON, one pair of files per batch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.torch import load_file, save_file

from rlctl.dispatch import DataProto
from rlctl.errors import UserError
from rlctl.trainer.loops.pipeline import Produced

PENDING_DIR = "pending"
CARRIED_DIR = "carried"


def save_pending(path: Path, items: list[Produced]) -> None:
    """Write ``items`` under ``path/pending/`` (nothing when there are none)."""
    if not items:
        return
    root = path / PENDING_DIR
    root.mkdir()
    for item in items:
        record = {
            "index": item.index,
            "version": item.version,
            "counts": item.counts,
            "seconds": item.seconds,
            "data_state": item.data_state,
            "meta": item.batch.meta,
        }
        _write(root / f"batch_{item.index:06d}", item.batch, record)


def load_pending(path: Path) -> list[Produced]:
    """The batches ``save_pending`` wrote at ``path`` (oldest first; empty when there are none)."""
    root = path / PENDING_DIR
    if not root.is_dir():
        return []
    items = []
    for meta_file in sorted(root.glob("batch_*.json")):
        tensors, non_tensor, record = _read(meta_file.with_suffix(""), path, meta_file.name)
        batch = DataProto(tensors, non_tensor, record["meta"])
        items.append(
            Produced(
                record["index"],
                batch,
                record["version"],
                record["counts"],
                record["seconds"],
                record["data_state"],
            )
        )
    return items


def save_carried(path: Path, prompts: DataProto | None) -> None:
    """Carried partial rollouts: the prompts drawn but not yet trained, under ``path/carried/``."""
    if prompts is None:
        return
    root = path / CARRIED_DIR
    root.mkdir()
    _write(root / "prompts", prompts, {})


def load_carried(path: Path) -> DataProto | None:
    """The prompts ``save_carried`` wrote at ``path`` (None when there are none)."""
    root = path / CARRIED_DIR
    if not root.is_dir():
        return None
    tensors, non_tensor, _ = _read(root / "prompts", path, f"{CARRIED_DIR}/")
    return DataProto(tensors, non_tensor)


def _write(stem: Path, proto: DataProto, record: dict[str, Any]) -> None:
    """``proto``'s tensors at ``stem.safetensors`` (no shared storage), ``record`` plus its
    non-tensor columns at ``stem.json``."""
    save_file({k: v.detach().cpu().clone() for k, v in proto.batch.items()}, f"{stem}.safetensors")
    columns = {k: _column_to_json(k, v) for k, v in proto.non_tensor.items()}
    Path(f"{stem}.json").write_text(json.dumps({**record, "non_tensor": columns}))


def _read(stem: Path, checkpoint: Path, what: str) -> tuple[dict, dict, dict[str, Any]]:
    """What :func:`_write` wrote at ``stem``: tensors, non-tensor columns, the record; a UserError
    naming ``what`` of the ``--resume`` checkpoint when it cannot be read."""
    try:
        record = json.loads(Path(f"{stem}.json").read_text())
        tensors = load_file(f"{stem}.safetensors")
    except (OSError, ValueError) as exc:
        raise UserError(f"--resume {checkpoint}: {what} cannot be read ({exc})") from exc
    return tensors, {k: _column_from_json(v) for k, v in record["non_tensor"].items()}, record


def _column_to_json(name: str, column: np.ndarray) -> dict[str, Any]:
    values = column.tolist()
    try:
        json.dumps(values)
    except TypeError as exc:
        raise TypeError(f"non-tensor column {name!r} cannot be saved in a checkpoint: {exc}") from exc
    return {"dtype": column.dtype.str if column.dtype != object else "object", "values": values}


def _column_from_json(saved: dict[str, Any]) -> np.ndarray:
    if saved["dtype"] == "object":
        column = np.empty(len(saved["values"]), dtype=object)
        for i, value in enumerate(saved["values"]):  # element-wise: a list entry stays one entry
            column[i] = value
        return column
    return np.asarray(saved["values"], dtype=np.dtype(saved["dtype"]))
