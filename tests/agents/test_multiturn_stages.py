"""Driver stages on multi-turn batches: the outcome reward sits on the model's last token and
trimming keeps observation tokens (attention 1, response mask 0)."""

from __future__ import annotations

import torch

from rlctl.agents.driver import on_last_model_token, score_episodes
from rlctl.dispatch import DataProto
from rlctl.trainer.step.stages import token_level_scores, trim_response_padding

MASK = torch.tensor([[1, 1, 0, 0, 0, 1, 0, 0], [1, 0, 0, 1, 1, 0, 0, 0]])  # model, obs, model, pad
ATTN = torch.tensor([[1, 1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 0, 0, 0]])


def test_outcome_reward_on_the_last_model_token():
    scores = torch.tensor([2.0, 3.0])
    for place in (token_level_scores, on_last_model_token):
        out = place(scores, MASK)
        assert out[0].nonzero().flatten().tolist() == [5] and out[1].nonzero().flatten().tolist() == [4]
        assert out.sum().item() == 5.0


def test_trim_keeps_observation_columns():
    b, p = 2, 3
    resp = torch.arange(16).view(b, 8)
    batch = DataProto.from_dict(
        tensors={
            "input_ids": torch.cat([torch.ones(b, p, dtype=torch.long), resp], 1),
            "attention_mask": torch.cat([torch.ones(b, p, dtype=torch.long), ATTN], 1),
            "position_ids": torch.arange(p + 8).expand(b, -1),
            "responses": resp,
            "response_mask": MASK,
        }
    )
    trimmed = trim_response_padding(batch)
    assert trimmed.batch["responses"].shape[1] == 6  # the last attended column, not the mask's count


def test_environment_rewards_and_deferred_rows_are_scored():
    class Scorer:
        def score(self, batch, shaping=True):
            t = {"raw_scores": torch.tensor([9.0, 9.0]), "scores": torch.tensor([9.0, 9.0])}
            t["acc"] = torch.tensor([1.0, 1.0])
            return batch.union(DataProto.from_dict(tensors=t)), {"reward/errors": 0.0}

    batch = DataProto.from_dict(
        tensors={
            "response_mask": MASK,
            "agent_reward": torch.tensor([0.5, float("nan")]),
            "agent_success": torch.tensor([0.0, 0.0]),
        }
    )
    out, counts = score_episodes(batch, Scorer())
    assert out.batch["scores"].tolist() == [0.5, 9.0] and out.batch["acc"].tolist() == [0.0, 1.0]
    assert out.batch["token_level_scores"][1, 4].item() == 9.0 and counts == {"reward/errors": 0.0}
