"""Responses end on any of the model's end tokens, and the length metrics say what happened."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from rlctl.dispatch import DataProto
from rlctl.engines.hf_rollout import HFRolloutEngine
from rlctl.trainer.setup.models import stop_token_ids
from rlctl.trainer.step.stages import batch_metrics
from tests.engines.helpers import PAD, make_batch, make_model


def test_stop_tokens_join_the_tokenizer_eos_and_every_generation_config_eos(tmp_path):
    tok = SimpleNamespace(eos_token_id=7)
    assert stop_token_ids(str(tmp_path), tok) == [7]  # no generation_config.json: the tokenizer's alone
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [9, 7, 11]}))
    assert stop_token_ids(str(tmp_path), tok) == [7, 9, 11]  # Llama-3 / Qwen2.5-style lists
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 3}))
    assert stop_token_ids(str(tmp_path), SimpleNamespace(eos_token_id=None)) == [3]


def _batch(responses: list[list[int]], lengths: list[int]) -> DataProto:
    resp = torch.tensor(responses)
    mask = torch.tensor([[1] * n + [0] * (resp.shape[1] - n) for n in lengths])
    return DataProto.from_dict(
        tensors={"responses": resp, "response_mask": mask, "scores": torch.zeros(len(responses))}
    )


def test_clip_ratio_counts_only_responses_cut_by_the_budget():
    # row 0 ends on a stop token exactly at the budget (finished); row 1 is cut; row 2 stopped early
    batch = _batch([[5, 6, 2], [5, 6, 6], [2, 0, 0]], [3, 3, 1])
    m = batch_metrics(batch, max_new_tokens=3, stop_ids=[2, 4])
    assert m["response_length/clip_ratio"] == pytest.approx(1 / 3)
    assert m["response_length/max"] == 3 and m["response_length/mean"] == pytest.approx(7 / 3)
    # a second end token counts the same as the first
    assert (
        batch_metrics(_batch([[5, 4]], [2]), max_new_tokens=2, stop_ids=[2, 4])["response_length/clip_ratio"]
        == 0
    )


def test_long_responses_and_a_second_end_token(tmp_path):
    """512 new tokens in one generate call; a stop list ends rows on whichever end token comes."""
    engine = HFRolloutEngine(make_model(tmp_path / "m", seed=3))
    b = make_batch(2, prompt_len=5, resp_len=1, seed=0)
    ids, mask = b["input_ids"][:, :5], b["attention_mask"][:, :5]
    long = engine.generate(ids, mask, max_new_tokens=512, greedy=True, eos_token_id=None, pad_token_id=PAD)
    assert long["responses"].shape == (2, 512) and long["response_mask"].all()
    m = batch_metrics(DataProto.from_dict(tensors={**long, "scores": torch.zeros(2)}), 512, [PAD])
    assert m["response_length/mean"] == 512 and m["response_length/clip_ratio"] == 1.0

    third = int(long["responses"][0, 2])  # row 0's third greedy token becomes a second end token
    out = engine.generate(
        ids, mask, max_new_tokens=512, greedy=True, eos_token_id=[PAD, third], pad_token_id=PAD
    )
    first = [i for i, t in enumerate(long["responses"][0].tolist()) if t == third][0]
    assert int(out["response_mask"][0].sum()) == first + 1
    assert out["responses"][0, first] == third
