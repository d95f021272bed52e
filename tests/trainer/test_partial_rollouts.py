"""Partial rollouts (``trainer.partial_rollouts``, async): a rollout worker takes the driver's newer
published weights between decode steps, the rows in flight going on under them; every token
carries its version, the swap is checked as a push is, and a killed run resumes with each prompt
trained once."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from rlctl.dispatch import DataProto
from rlctl.engines.hf_rollout import HFRolloutEngine
from rlctl.errors import RunError
from rlctl.trainer.workers.rollout import RolloutWorker
from rlctl.trainer.workers.weight_streams import PublishedWeights
from tests.trainer.test_resume_and_failures import kill_at_checkpoint, rlctl, trained_by_step
from tests.trainer.test_train_e2e import by_step, metrics


class Board:
    """The driver's newest published version, as the async source answers it: version 4 appears
    after the generation has asked ``after`` times."""

    def __init__(self, weights: dict[str, torch.Tensor], after: int) -> None:
        self.weights, self.after, self.asked = weights, after, 0

    def newer(self, than: int):
        self.asked += 1
        if self.asked < self.after or than >= 4:
            return None
        return 4, PublishedWeights(self.weights)


def _worker(model: str, version: int) -> tuple[RolloutWorker, HFRolloutEngine]:
    engine = HFRolloutEngine(model, dtype="float32")
    worker = RolloutWorker.__new__(RolloutWorker)
    worker._rlctl_ctx = SimpleNamespace(rank=0)
    worker.spec = SimpleNamespace(engine=SimpleNamespace(device_type="cpu"))
    worker.rollout, worker.version = engine, version
    return worker, engine


def test_a_generation_spanning_a_swap_carries_both_versions_and_the_swap_is_checked(tiny_model):
    worker, engine = _worker(tiny_model, 3)
    torch.manual_seed(0)
    new = {n: t.detach().clone() + 0.05 * torch.randn_like(t) for n, t in engine.local_tensors().items()}
    worker.attach_board(Board(new, after=3))
    prompts = DataProto.from_dict(
        tensors={"input_ids": torch.randint(3, 30, (4, 5)), "attention_mask": torch.ones(4, 5, dtype=torch.long)},
        meta={"max_new_tokens": 12, "eos_token_id": None, "pad_token_id": 0, "seed": 1},
    )
    out = worker.generate_sequences(prompts)
    tokens, mask = out.batch["token_versions"], out.batch["response_mask"].bool()
    assert out.batch["weight_version"].tolist() == [3, 3, 3, 3]  # each row's first version
    assert tokens[mask].min() == 3 and tokens[mask].max() == 4  # never older than the start
    assert tokens[:, :3].eq(3).all() and tokens[:, 3:][mask[:, 3:]].eq(4).all()  # swapped after token 3
    assert worker.version == 4 and worker.held_version() == 4  # the pipeline's next push skips it
    version, checks = worker.swapped
    assert version == 4 and checks["sync/fingerprint_ok"] == 1.0
    for name, t in engine.local_tensors().items():
        assert torch.equal(t, new[name]), name
    # the pipeline's next push of version 4 is the swap already loaded and checked
    assert worker.update_weights(PublishedWeights(new), 4) is checks


def test_a_swap_that_loaded_other_weights_stops_naming_the_rank(tiny_model, monkeypatch):
    """The weights a swap loaded pass the fingerprint as a push's do: a planted wrong load fails
    that generation, naming the rank."""
    worker, engine = _worker(tiny_model, 3)
    new = {n: t.detach().clone() + 0.05 for n, t in engine.local_tensors().items()}
    real = engine.update_weights

    def wrong(stream):
        return real((name, t + 1.0 if i == 0 else t) for i, (name, t) in enumerate(stream))

    monkeypatch.setattr(engine, "update_weights", wrong)
    worker.attach_board(Board(new, after=2))
    prompts = DataProto.from_dict(
        tensors={"input_ids": torch.randint(3, 30, (2, 5)), "attention_mask": torch.ones(2, 5, dtype=torch.long)},
        meta={"max_new_tokens": 6, "eos_token_id": None, "pad_token_id": 0, "seed": 1},
    )
    with pytest.raises(RunError, match="rank 0"):
        worker.generate_sequences(prompts)


def test_without_a_board_one_version_per_generation(tiny_model):
    worker, _ = _worker(tiny_model, 2)
    prompts = DataProto.from_dict(
        tensors={"input_ids": torch.randint(3, 30, (2, 5)), "attention_mask": torch.ones(2, 5, dtype=torch.long)},
        meta={"max_new_tokens": 6, "eos_token_id": None, "pad_token_id": 0, "seed": 1},
    )
    out = worker.generate_sequences(prompts)
    assert out.batch["token_versions"][out.batch["response_mask"].bool()].eq(2).all()


PARTIAL = 'mode = "async"\nmax_staleness = 1\npartial_rollouts = "swap"\nlog_samples = 64\nlog_samples_every = 1\n'


@pytest.mark.timeout(600)
def test_killed_async_run_with_partial_rollouts_resumes_with_each_prompt_trained_once(write_profile, tmp_path):
    full = write_profile("full", steps=6, extra=PARTIAL)
    broken = write_profile("broken", steps=6, extra=PARTIAL)
    proc = rlctl("train", str(full))
    _, err = proc.communicate(timeout=500)
    assert proc.returncode == 0, err

    # killed while the rollout thread is generating ahead: partial rollouts in flight
    kill_at_checkpoint(broken, tmp_path / "runs/broken/checkpoints/step_000002")
    assert max(r["step"] for r in metrics(tmp_path / "runs/broken")) < 6

    proc = rlctl("train", str(broken), "--resume", "auto")
    _, err = proc.communicate(timeout=500)
    assert proc.returncode == 0, err
    resumed = by_step(metrics(tmp_path / "runs/broken"))
    assert sorted(resumed) == list(range(7)), "metrics.jsonl must hold each step exactly once"
    for step in range(1, 7):
        assert resumed[step]["async/staleness_max"] <= 1 and "async/swapped_rows_frac" in resumed[step]
    # the prompt stream: each step trained the same prompts as the uninterrupted run (none skipped,
    # none twice), whichever weights generated them
    assert trained_by_step(tmp_path / "runs/broken", "prompt") == trained_by_step(tmp_path / "runs/full", "prompt")
