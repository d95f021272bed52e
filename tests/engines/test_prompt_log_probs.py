"""The canary's rollout side: each engine scores a fixed token sequence through its own API (HF: a
forward; vLLM: ``SamplingParams(prompt_logprobs=0)``; SGLang: ``return_logprob`` with
``logprob_start_len=0``), against fakes built from the recorded surfaces of the floor and newest
releases; the scores equal the training engine's log-probs before and after a weight update."""

from __future__ import annotations

import pytest
import torch

from rlctl.engines.fsdp_train import FSDPTrainEngine
from rlctl.engines.hf_rollout import HFRolloutEngine
from rlctl.engines.sglang_rollout import SGLangRolloutEngine
from rlctl.engines.vllm_rollout import VLLMRolloutEngine
from rlctl.errors import RunError
from rlctl.trainer.state.canary import canary_batch, canary_tokens
from tests.engines.fakes import SGLANG_VERSIONS, VLLM_VERSIONS, install
from tests.engines.helpers import make_model

torch.set_num_threads(1)
CONTRACT = dict(device="cuda", dtype="float32", trust_remote_code=False)
VERSIONS = [("vllm", v) for v in VLLM_VERSIONS] + [("sglang", v) for v in SGLANG_VERSIONS]
ENGINES = {"vllm": VLLMRolloutEngine, "sglang": SGLangRolloutEngine}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    base = tmp_path_factory.mktemp("plp")
    return make_model(base / "a", seed=1), make_model(base / "b", seed=2)


def _trainer_scores(model_path, tokens) -> torch.Tensor:
    return FSDPTrainEngine(model_path).compute_log_prob(canary_batch(tokens))["log_probs"][0]


@pytest.mark.parametrize(("package", "version"), VERSIONS, ids=[f"{p}-{v}" for p, v in VERSIONS])
def test_external_engines_score_the_canary_as_the_trainer(package, version, models, monkeypatch, tmp_path):
    calls: list = []
    install(monkeypatch, tmp_path, package, version, calls)
    engine = ENGINES[package](str(models[0]), **CONTRACT)
    vocab = (
        engine.engine.hf.model.config.vocab_size
        if package == "sglang"
        else engine.llm.hf.model.config.vocab_size
    )
    tokens = canary_tokens(vocab)
    got = engine.prompt_log_probs(tokens)
    assert got.shape == (len(tokens) - 1,)
    assert torch.allclose(got.float(), _trainer_scores(models[0], tokens), atol=1e-5)
    request = [c for c in calls if c[0] == "generate"][-1]
    if package == "vllm":
        assert request[1] == [tokens] and request[2][0]["prompt_logprobs"] == 0
    else:
        assert request[1] == [tokens] and request[3] is True  # return_logprob
    # after a weight update the engine scores with the new weights
    engine.update_weights(FSDPTrainEngine(models[1]).export_weights("full"))
    got = engine.prompt_log_probs(tokens)
    assert torch.allclose(got.float(), _trainer_scores(models[1], tokens), atol=1e-5)
    engine.sleep()
    with pytest.raises(RunError, match="asleep"):
        engine.prompt_log_probs(tokens)


def test_hf_engine_scores_with_its_own_model_and_refuses_while_asleep(models):
    engine = HFRolloutEngine(str(models[0]))
    tokens = canary_tokens(engine.model.config.vocab_size)
    assert torch.allclose(engine.prompt_log_probs(tokens), _trainer_scores(models[0], tokens), atol=1e-5)
    engine.sleep()
    with pytest.raises(RunError, match="asleep"):
        engine.prompt_log_probs(tokens)
