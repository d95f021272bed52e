"""The driver loop's side of the update: ReMax's greedy baseline, updates laid out per DP group."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch

from rlctl.dispatch import DataProto
from rlctl.profile import load_profile
from rlctl.trainer.loops.sync import Trainer
from rlctl.trainer.setup.context import RunContext
from rlctl.trainer.step.minibatch import MINI_BATCH_ROWS


class RecordingPolicy:
    """Stands in for the policy WorkerGroup: answers generate_sequences, records every request."""

    dp_size = 2

    def __init__(self) -> None:
        self.requests: list[DataProto] = []

    def generate_sequences(self, request: DataProto) -> DataProto:
        self.requests.append(request)
        rows = len(request)
        return DataProto.from_dict(
            tensors={
                "responses": torch.zeros(rows, 2, dtype=torch.long),
                "response_mask": torch.ones(rows, 2),
            }
        )


class FixedScores:
    """``BatchScorer.score``'s contract: the scored batch and that pass's counts."""

    def score(self, batch: DataProto, *, shaping: bool = True) -> tuple[DataProto, dict[str, float]]:
        scored = batch.union(DataProto.from_dict(tensors={"scores": torch.arange(len(batch)).float()}))
        return scored, {"errors": 0.0}


def trainer(tmp_path, extra: str = "") -> tuple[Trainer, RecordingPolicy]:
    path = tmp_path / "p.toml"
    path.write_text(
        f'[model]\npath = "{tmp_path}"\n[algorithm]\npreset = "remax"\n'
        f"[rollout]\nn = 3\ntemperature = 0.9\nval_temperature = 0.7\n{extra}"
        "[trainer]\nprompts_per_step = 2\n"
    )
    policy = RecordingPolicy()
    tokenizer = SimpleNamespace(eos_token_id=1, pad_token_id=0)
    ctx = RunContext(
        load_profile(path), tmp_path, None, tokenizer, None, None, FixedScores(), policy, None, None, [1]
    )
    return Trainer(ctx), policy


def prompts(rows: int = 2) -> DataProto:
    return DataProto.from_dict(
        tensors={"input_ids": torch.ones(rows, 3, dtype=torch.long), "attention_mask": torch.ones(rows, 3)},
        non_tensors={"uid": np.array([f"u{i}" for i in range(rows)], dtype=object)},
    )


def test_remax_baseline_is_greedy_even_when_validation_samples(tmp_path):
    t, policy = trainer(tmp_path)
    batch = DataProto.from_dict(tensors={"x": torch.zeros(6)})
    out, _counts = t._remax_baseline(prompts(), batch, step=1)
    (request,) = policy.requests
    assert request.meta["greedy"] is True  # val_temperature = 0.7 used to make this a sampled baseline
    assert out["reward_baselines"].tolist() == [0.0, 0.0, 0.0, 1.0, 1.0, 1.0]  # one per prompt, x n


def test_updates_get_whole_prompt_groups_laid_out_for_the_group(tmp_path):
    t, policy = trainer(tmp_path, "[actor]\nmini_batch_prompts = 1\n")
    rows = 6
    batch = DataProto.from_dict(
        tensors={"response_mask": torch.ones(rows, 2), "advantages": torch.arange(rows).float()[:, None]},
        non_tensors={"uid": np.array(["a"] * 3 + ["b"] * 3, dtype=object), "text": np.array(["t"] * rows)},
    )
    laid = t._laid_out(batch, policy)
    assert laid.meta[MINI_BATCH_ROWS] == [2, 2]  # 2 mini-batches of 3 rows, each over 2 ranks
    assert laid.non_tensor == {}  # driver-only columns stay on the driver
    # rank 0: rows 0,1 | 3,4 ; rank 1: row 2 + padding | row 5 + padding
    assert laid["advantages"].flatten().tolist() == [0, 1, 3, 4, 2, 0, 5, 3]
    assert laid.padding_mask().tolist() == [False] * 5 + [True, False, True]
