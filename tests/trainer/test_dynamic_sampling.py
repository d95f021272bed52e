"""The driver's rollout stage with DAPO dynamic sampling, ReMax's baseline and validation scoring.

The rollout engine is the only fake (scripted responses per prompt); the scorer, the group filter
and the Trainer's stages are the real ones.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from rlctl.algorithms import groups_with_variance
from rlctl.dispatch import DataProto
from rlctl.profile import load_profile
from rlctl.rewards.manager import RewardManager
from rlctl.trainer.loops import sync as loop_mod
from rlctl.trainer.loops.sync import Trainer
from rlctl.trainer.step.scoring import BatchScorer
from rlctl.trainer.step.stages import StageTimer, groups_with_signal


def first_letter(data_source, solution_str, ground_truth, extra_info=None):
    """R... right, W... wrong, E... the scorer raises (the rest of the text only sets the length)."""
    if solution_str.startswith("E"):
        raise RuntimeError("scorer bug")
    return float(solution_str.startswith("R"))


class CharTokenizer:
    eos_token_id = pad_token_id = 0

    def batch_decode(self, rows, skip_special_tokens=True):
        return ["".join(chr(t) for t in row if t) for row in rows]


class ScriptedPolicy:
    """generate_sequences: prompt id (first prompt token) -> its scripted responses, in order."""

    def __init__(self, sampled: dict[int, list[str]], greedy: dict[int, str] | None = None, width: int = 4):
        self.sampled, self.greedy, self.width = sampled, greedy or {}, width

    def generate_sequences(self, request: DataProto) -> DataProto:
        ids = request.batch["input_ids"][:, 0].tolist()
        seen: dict[int, int] = {}
        rows = []
        for pid in ids:
            if request.meta.get("greedy"):
                text = self.greedy[pid]
            else:
                text = self.sampled[pid][seen.get(pid, 0)]
                seen[pid] = seen.get(pid, 0) + 1
            rows.append([ord(c) for c in text] + [0] * (self.width - len(text)))
        responses = torch.tensor(rows)
        mask = (responses != 0).long()
        prompt = request.batch["input_ids"]
        return DataProto.from_dict(
            tensors={
                "input_ids": torch.cat([prompt, responses], 1),
                "attention_mask": torch.cat([request.batch["attention_mask"], mask], 1),
                "responses": responses,
                "response_mask": mask,
            }
        )


class PromptStream:
    """next_batch: the next ``per_step`` prompt ids, each its own group."""

    def __init__(self, ids: list[int], per_step: int):
        self.ids, self.per_step, self.cursor = ids, per_step, 0

    def next_batch(self) -> DataProto:
        chosen = self.ids[self.cursor : self.cursor + self.per_step]
        self.cursor += self.per_step
        return prompts(chosen)


def prompts(ids: list[int]) -> DataProto:
    k = len(ids)
    return DataProto.from_dict(
        tensors={
            "input_ids": torch.tensor(ids).view(k, 1),
            "attention_mask": torch.ones(k, 1, dtype=torch.long),
        },
        non_tensors={
            "uid": np.array([f"p{i}" for i in ids], dtype=object),
            "data_source": np.array(["s"] * k, dtype=object),
            "ground_truth": np.array(["R"] * k, dtype=object),
            "extra_info": np.array([{}] * k, dtype=object),
        },
    )


def make_trainer(tmp_path, policy, ids, toml: str = "", max_error_rate: float = 1.0) -> Trainer:
    (tmp_path / "p.toml").write_text(
        '[model]\npath = "m"\n[rollout]\nn = 2\nmax_new_tokens = 4\n[trainer]\nprompts_per_step = 2\n' + toml
    )
    profile = load_profile(tmp_path / "p.toml")
    manager = RewardManager(first_letter, "custom", max_error_rate=max_error_rate)
    scorer = BatchScorer(
        CharTokenizer(),
        manager,
        max_new_tokens=profile.rollout.max_new_tokens,
        overlong_buffer=profile.algorithm.overlong_buffer,
        overlong_penalty_factor=profile.algorithm.overlong_penalty,
    )
    ctx = SimpleNamespace(
        profile=profile,
        policy=policy,
        reward=scorer,
        train_data=PromptStream(ids, profile.trainer.prompts_per_step),
        sampling=lambda validation=False: {},
        val_prompts=None,
        run_dir=tmp_path,
    )
    return Trainer(ctx)


DAPO = "[algorithm]\npreset = 'dapo'\noverlong_buffer = 2\nmax_sampling_rounds = {rounds}\n"


def uids(batch: DataProto) -> list[str]:
    return list(batch.non_tensor["uid"])


def test_keeps_exactly_the_groups_with_accuracy_variance_and_resamples(tmp_path):
    # Overlong ramp from length 2 (max 4, buffer 2): shaped scores differ by length alone.
    policy = ScriptedPolicy(
        {
            1: ["W", "Wxxx"],  # all wrong, lengths 1 and 4: shaped 0 and -1, accuracy 0 and 0
            2: ["R", "W"],  # accuracy varies
            3: ["Rxxx", "R"],  # all right, lengths differ
            4: ["E", "Wxx"],  # a scorer error (0) and a wrong answer: no signal, one error
            5: ["Wx", "Rxx"],  # accuracy varies
        }
    )
    trainer = make_trainer(tmp_path, policy, [1, 2, 3, 4, 5, 1], DAPO.format(rounds=5))
    batch, metrics = trainer.rollout(StageTimer(), step=1)
    assert uids(batch) == ["p2", "p2", "p5", "p5"]  # not p1 or p3, whose shaped scores vary
    assert metrics["dapo/rounds"] == 3.0
    assert metrics["dapo/kept_groups"] == 2.0 and metrics["dapo/refilled_groups"] == 0.0
    assert metrics["reward/errors"] == 1.0  # counted in round 2 and kept after round 3
    # the shaped reward is still what trains: p5's "Rxx" has length 3, half a penalty
    assert batch.batch["scores"].tolist() == [1.0, 0.0, 0.0, 0.5]


def test_runs_out_of_rounds_reports_what_it_refilled(tmp_path, monkeypatch):
    warnings = []

    class Recorder:
        def warning(self, msg, **kw):
            warnings.append((msg, kw))

        def info(self, *a, **kw):
            pass

    monkeypatch.setattr(loop_mod, "log", Recorder())
    policy = ScriptedPolicy({1: ["R", "R"], 2: ["W", "Wxxx"], 3: ["R", "W"], 4: ["Wx", "W"]})
    trainer = make_trainer(tmp_path, policy, [1, 2, 3, 4], DAPO.format(rounds=2))
    batch, metrics = trainer.rollout(StageTimer(), step=7)
    assert len(batch) == 4 and uids(batch)[:2] == ["p3", "p3"]
    assert metrics["dapo/rounds"] == 2.0
    assert metrics["dapo/kept_groups"] == 1.0 and metrics["dapo/refilled_groups"] == 1.0
    assert metrics["dapo/kept_fraction"] == 0.5
    assert len(warnings) == 1 and warnings[0][1]["refilled_groups"] == 1 and warnings[0][1]["step"] == 7


def test_score_metric_filters_on_the_unshaped_score_and_seq_reward_on_the_shaped(tmp_path):
    policy = ScriptedPolicy({1: ["W", "Wxxx"], 2: ["R", "R"]})
    toml = DAPO.format(rounds=1) + "dynamic_sampling_metric = '{metric}'\n"
    for metric, kept in (("score", []), ("seq_reward", ["p1", "p1"])):
        trainer = make_trainer(tmp_path, policy, [1, 2], toml.format(metric=metric))
        _, metrics = trainer.rollout(StageTimer(), step=1)
        assert metrics["dapo/kept_groups"] == len(kept) // 2, metric


def test_trainer_filter_and_tested_helper_agree_on_single_sample_groups():
    values = torch.tensor([1.0, 0.0, 2.0, 2.0, 5.0])
    index = np.array(["a", "a", "b", "b", "c"], dtype=object)
    expected = [True, True, False, False, True]  # a group of one is kept, as verl (len == 1)
    assert groups_with_signal(values, index).tolist() == expected
    assert groups_with_variance(values, index).tolist() == expected


def test_remax_counts_errors_of_both_scoring_passes(tmp_path):
    policy = ScriptedPolicy({1: ["E", "R"], 2: ["W", "R"]}, greedy={1: "R", 2: "E"})
    trainer = make_trainer(tmp_path, policy, [1, 2], "[algorithm]\npreset = 'remax'\n")
    batch, metrics = trainer.rollout(StageTimer(), step=1)
    assert metrics["reward/errors"] == 2.0  # one sampled, one greedy baseline
    assert batch.batch["reward_baselines"].tolist() == [1.0, 1.0, 0.0, 0.0]
    assert batch.batch["scores"].tolist() == [0.0, 1.0, 0.0, 1.0]


def test_validation_score_is_not_lowered_by_the_overlong_penalty(tmp_path):
    policy = ScriptedPolicy({1: ["Rxxx"], 2: ["Rxx"]}, greedy={1: "Rxxx", 2: "Rxx"})
    trainer = make_trainer(tmp_path, policy, [], DAPO.format(rounds=1))
    trainer.ctx.val_prompts = prompts([1, 2])
    out = trainer.validate()
    assert out["val/score_mean"] == pytest.approx(1.0) and out["val/accuracy"] == pytest.approx(1.0)
    shaped, _ = trainer.ctx.reward.score(trainer.generate(prompts([1, 2]), 1, seed=0, greedy=True))
    assert shaped.batch["scores"].tolist() == [0.0, 0.5]  # training-time shaping still applies
