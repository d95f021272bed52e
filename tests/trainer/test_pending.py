"""Batches generated before a checkpoint come back from it unchanged, without pickle."""

from __future__ import annotations

import numpy as np
import torch

from rlctl.dispatch import DataProto
from rlctl.trainer.loops.pending import PENDING_DIR, load_pending, save_pending
from rlctl.trainer.loops.pipeline import Produced


def test_a_pending_batch_round_trips(tmp_path):
    scores = torch.tensor([0.5, 1.0])
    batch = DataProto(
        {
            "responses": torch.tensor([[3, 4], [5, 6]]),
            "scores": scores,
            "raw_scores": scores,
        },  # shared storage
        {
            "ground_truth": ["7", "12"],
            "extra_info": [{"index": 1, "tags": ["a"]}, {"index": 2, "tags": []}],
            "tools": [["calc"], ["calc", "search"]],  # list entries stay one entry per row
            "uid": np.array([10, 11]),
        },
        {"temperature": 1.0},
    )
    item = Produced(3, batch, 2, {"reward/accuracy": 0.5}, {"gen": 0.1}, {"epoch": 0, "cursor": 8})
    save_pending(tmp_path, [item])
    (back,) = load_pending(tmp_path)
    assert (back.index, back.version, back.counts, back.seconds, back.data_state) == (
        3,
        2,
        {"reward/accuracy": 0.5},
        {"gen": 0.1},
        {"epoch": 0, "cursor": 8},
    )
    for key, value in batch.batch.items():
        assert torch.equal(back.batch.batch[key], value) and back.batch.batch[key].dtype == value.dtype
    for key, column in batch.non_tensor.items():
        assert back.batch.non_tensor[key].dtype == column.dtype
        assert back.batch.non_tensor[key].tolist() == column.tolist()
    assert back.batch.meta == {"temperature": 1.0}
    assert not list((tmp_path / PENDING_DIR).glob("*.pt"))


def test_no_pending_batches_write_nothing(tmp_path):
    save_pending(tmp_path, [])
    assert not (tmp_path / PENDING_DIR).exists() and load_pending(tmp_path) == []
