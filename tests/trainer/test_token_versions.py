"""Per-token policy versions: the staleness metrics count each response token at the version it was
sampled with, so a sequence whose weights were swapped mid-generation is not counted at its oldest."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import rlctl.trainer.loops.pipelined as pipelined
from rlctl.dispatch import DataProto
from rlctl.errors import RunError
from rlctl.trainer.loops.pipelined import Pipeline, staleness_metrics
from rlctl.trainer.workers.sampling import _pad_responses


def test_staleness_is_per_token_when_versions_are():
    rows = torch.tensor([3, 4])  # the version each row started with
    tokens = torch.tensor([[3, 3, 4, 4, 0], [4, 4, 4, 0, 0]])  # row 0 spans a swap 3 -> 4
    mask = (tokens > 0).long()
    m = staleness_metrics(rows, 5, tokens, mask)
    assert m["async/staleness_min"] == 1.0 and m["async/staleness_max"] == 2.0
    assert abs(m["async/staleness_mean"] - 9 / 7) < 1e-6  # lags 2,2,1,1 and 1,1,1
    assert m["async/staleness_seq_mean"] == 1.5  # per sequence, at its first version
    per_seq = staleness_metrics(rows, 5)
    assert per_seq["async/staleness_mean"] == 1.5 and per_seq["async/staleness_min"] == 1.0


def test_token_versions_are_padded_with_the_responses():
    out = {
        "responses": torch.ones(2, 3, dtype=torch.long),
        "input_ids": torch.ones(2, 5, dtype=torch.long),
        "response_mask": torch.ones(2, 3, dtype=torch.long),
        "attention_mask": torch.ones(2, 5, dtype=torch.long),
        "position_ids": torch.arange(5).repeat(2, 1),
        "rollout_log_probs": torch.zeros(2, 3),
        "token_versions": torch.tensor([[1, 1, 2], [2, 2, 2]]),
    }
    padded = _pad_responses(out, 5, 0)
    assert padded["token_versions"].tolist() == [[1, 1, 2, 0, 0], [2, 2, 2, 0, 0]]


def test_a_token_older_than_the_bound_fails_its_batch(monkeypatch):
    """The rollout thread's gate looks at every response token: a row that started at an allowed
    version but holds an older token (or a row-level version that hides one) is refused."""

    def batch(tokens):
        return DataProto.from_dict(
            tensors={
                "weight_version": torch.tensor([5, 5]),
                "token_versions": torch.tensor(tokens),
                "response_mask": torch.tensor([[1, 1, 0], [1, 1, 1]]),
            }
        )

    made = {}
    monkeypatch.setattr(pipelined, "peak_memory_metrics", lambda groups: {})
    source = Pipeline(
        SimpleNamespace(train_data=SimpleNamespace(state_dict=lambda: {})), exact=False, max_staleness=2
    )
    source.stage = lambda timer, index, sampler: (made["batch"], {})  # the loop's rollout stage
    source.pipeline = SimpleNamespace(required=lambda index: 5)
    made["batch"] = batch([[5, 6, 0], [5, 5, 6]])  # the padding's 0 is no token
    assert source._produce(7, 5).index == 7
    made["batch"] = batch([[5, 6, 0], [4, 5, 6]])
    with pytest.raises(RunError, match="version 4, older than allowed"):
        source._produce(7, 5)
