"""Reward-model scorer with a tiny randomly initialised sequence-classification model."""

from __future__ import annotations

import pytest

from rlctl.errors import UserError
from rlctl.models import build_tiny_model, build_tiny_reward_model
from rlctl.rewards import build_reward_manager
from rlctl.rewards.reward_model import RewardModelScorer

PROMPT = [{"role": "user", "content": "1+1="}]


@pytest.fixture(scope="module")
def rm_path(tmp_path_factory):
    return build_tiny_reward_model("tiny-1m", tmp_path_factory.mktemp("rm"), seed=0)


def test_scores_are_per_sample_and_independent_of_batch_padding(rm_path):
    scorer = RewardModelScorer(rm_path)
    batch = scorer.score([PROMPT] * 3, ["2", "3", "a much longer answer"])
    assert len(batch) == 3 and len(set(batch)) == 3
    alone = [scorer.score([PROMPT], [r])[0] for r in ["2", "3", "a much longer answer"]]
    assert batch == pytest.approx(alone, abs=1e-5)


def test_manager_with_reward_model(rm_path):
    mgr = build_reward_manager("reward_model", model_path=rm_path, max_error_rate=1.0)
    out = mgr.score(["s", "s"], ["2", "3"], ["2", "2"], prompts=[PROMPT, PROMPT])
    assert out.acc is None and len(out.scores) == 2 and out.metrics["reward/errors"] == 0
    missing = mgr.score(["s"], ["2"], ["2"])  # no prompts: counted as an error, not a crash
    assert missing.scores == [0.0] and missing.metrics["reward/errors"] == 1.0


def test_bad_reward_model_paths(tmp_path):
    with pytest.raises(UserError, match="not a model directory"):
        RewardModelScorer(tmp_path)
    lm = build_tiny_model("tiny-1m", tmp_path / "lm")
    with pytest.raises(UserError, match="num_labels=1"):
        RewardModelScorer(lm)  # a causal LM config has 2 default labels
