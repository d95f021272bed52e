"""Driver-side stages: padding trim is exact, outcome rewards land on the last token, DAPO filter."""

from __future__ import annotations

import numpy as np
import torch

from rlctl.dispatch import DataProto
from rlctl.trainer.step.stages import groups_with_signal, token_level_scores, trim_response_padding


def _batch(lengths: list[int], prompt: int = 3, width: int = 6) -> DataProto:
    b = len(lengths)
    rmask = torch.tensor([[1] * n + [0] * (width - n) for n in lengths])
    return DataProto.from_dict(
        tensors={
            "input_ids": torch.arange(b * (prompt + width)).view(b, prompt + width),
            "attention_mask": torch.cat([torch.ones(b, prompt, dtype=torch.long), rmask], 1),
            "position_ids": torch.arange(prompt + width).expand(b, -1).clone(),
            "prompts": torch.zeros(b, width, dtype=torch.long),  # same width as responses: must stay
            "responses": torch.arange(b * width).view(b, width),
            "response_mask": rmask,
            "scores": torch.ones(b),
        },
        non_tensors={"uid": np.array(["a"] * b, dtype=object)},
    )


def test_trim_keeps_every_used_column_and_drops_the_rest():
    batch = _batch([2, 4, 1])
    out = trim_response_padding(batch)
    assert out.batch["responses"].shape[1] == 4
    assert out.batch["input_ids"].shape[1] == 3 + 4
    assert out.batch["prompts"].shape[1] == 6
    assert torch.equal(out.batch["responses"], batch.batch["responses"][:, :4])
    assert torch.equal(out.batch["response_mask"].sum(-1), batch.batch["response_mask"].sum(-1))


def test_trim_is_a_no_op_when_a_row_is_full():
    batch = _batch([6, 1])
    assert trim_response_padding(batch) is batch


def test_outcome_reward_on_last_valid_token():
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])
    out = token_level_scores(torch.tensor([2.0, 3.0, 5.0]), mask)
    assert torch.equal(out, torch.tensor([[0.0, 2.0, 0.0], [3.0, 0.0, 0.0], [0.0, 0.0, 0.0]]))


def test_dynamic_sampling_keeps_groups_with_different_scores():
    uids = np.array(["a", "a", "b", "b", "c", "c"], dtype=object)
    keep = groups_with_signal(torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0]), uids)
    assert keep.tolist() == [True, True, False, False, False, False]
