"""Carried partial rollouts (``trainer.partial_rollouts = "carry"``): rows cut at a round's stop go on
in the next round under newer weights, each token keeping its version and the exact log-prob of the
weights that sampled it; stale rows start over; nothing drawn is lost or trained twice, also across
a kill and resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rlctl.dispatch import DataProto
from rlctl.engines.hf_rollout import HFRolloutEngine
from rlctl.trainer.loops.carry import CarriedRollouts
from rlctl.trainer.workers.sampling import sample_rows
from tests.engines.helpers import PAD, VOCAB, make_batch, make_model
from tests.trainer.conftest import TINY_RL
from tests.trainer.test_resume_and_failures import kill_at_checkpoint, rlctl, trained_by_step
from tests.trainer.test_train_e2e import by_step, metrics

torch.set_num_threads(1)
N, NEW_TOKENS = 2, 12
STOPS = list(range(3, 3 + VOCAB // 6))  # about one token in six ends a row: lengths vary


class Workers:
    """A rollout group of one rank, as ``RolloutWorker.generate_sequences`` answers: every token
    carries the version the engine holds."""

    def __init__(self, engine: HFRolloutEngine, weights: dict[int, dict[str, torch.Tensor]]) -> None:
        self.engine, self.weights, self.version = engine, weights, 1
        self.stops: list[float] = []  # each round's stop share
        engine.update_weights(weights[1].items())

    def hold(self, version: int) -> None:
        self.version = version
        self.engine.update_weights(self.weights[version].items())

    def generate_sequences(self, request: DataProto) -> DataProto:
        self.stops.append(request.meta["stop_share"])
        out = sample_rows(self.engine, request, 0)
        out["token_versions"] = out["response_mask"].long() * self.version
        return DataProto.from_dict(out)


class Stream:
    """Prompts of distinct uids, four at a time, as the run's prompt stream draws them."""

    def __init__(self) -> None:
        self.drawn = 0
        self.prompts: dict[str, list[int]] = {}

    def __call__(self) -> DataProto:
        b = make_batch(4, prompt_len=6, resp_len=1, seed=self.drawn)
        ids, mask = b["input_ids"][:, :6], b["attention_mask"][:, :6]
        uids = [f"p{self.drawn + i}" for i in range(4)]
        for uid, row, m in zip(uids, ids, mask, strict=True):
            self.prompts[uid] = row[m.bool()].tolist()
        self.drawn += 4
        return DataProto.from_dict({"input_ids": ids, "attention_mask": mask}, {"uid": uids})


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    return HFRolloutEngine(make_model(tmp_path_factory.mktemp("m") / "a", seed=5))


def _weights(engine) -> dict[int, dict[str, torch.Tensor]]:
    w1 = {n: t.detach().clone() for n, t in engine.local_tensors().items()}
    g = torch.Generator().manual_seed(0)
    w2 = {n: t + 0.5 * t.std().nan_to_num(0.02) * torch.randn(t.shape, generator=g) for n, t in w1.items()}
    return {1: w1, 2: w2}


def _request(stream: Stream, seed: int) -> DataProto:
    prompts = stream().repeat(N, interleave=True)
    prompts.meta.update(
        temperature=1.0, max_new_tokens=NEW_TOKENS, eos_token_id=STOPS, pad_token_id=PAD, seed=seed
    )
    return prompts


def _carry(workers: Workers, stream: Stream) -> CarriedRollouts:
    return CarriedRollouts(workers, stream, n=N, max_new_tokens=NEW_TOKENS, stop_share=0.5, pad_token_id=PAD)


def _scores(engine, weights, batch: DataProto) -> torch.Tensor:
    """Each row's response tokens scored teacher-forced by ``weights``."""
    engine.update_weights(weights.items())
    out = torch.zeros_like(batch.batch["rollout_log_probs"])
    for i, (ids, mask) in enumerate(zip(batch.batch["input_ids"], batch.batch["attention_mask"], strict=True)):
        length = int(batch.batch["response_mask"][i].sum())
        out[i, :length] = engine.prompt_log_probs(ids[mask.bool()].tolist())[-length:]
    return out


def test_a_row_carried_across_a_weight_change_keeps_each_tokens_version_and_exact_log_prob(engine):
    weights = _weights(engine)
    workers, stream = Workers(engine, weights), Stream()
    carry = _carry(workers, stream)
    first = carry.generate_sequences(_request(stream, seed=1))
    assert len(first) == 4 * N and carry.flight, "the round's cut left rows to carry"
    workers.hold(2)  # the next batch is generated under newer weights
    carry.required = 1
    second = carry.generate_sequences(_request(stream, seed=2))
    batch = DataProto.concat([first, second])
    versions, live = batch.batch["token_versions"], batch.batch["response_mask"].bool()
    spans = [(v[m] == 1).any() and (v[m] == 2).any() for v, m in zip(versions, live, strict=True)]
    assert any(spans), "some row spans the two versions"
    got = batch.batch["rollout_log_probs"]
    s1, s2 = _scores(engine, weights[1], batch), _scores(engine, weights[2], batch)
    old, new = live & (versions == 1), live & (versions == 2)
    assert (got[old] - s1[old]).abs().max() < 1e-4
    assert (got[new] - s2[new]).abs().max() < 1e-4
    assert (s1[new] - s2[new]).abs().mean() > 0.05  # the two policies do differ on those tokens
    # each row's oldest token is its reported version; the columns are its own prompt's
    oldest = torch.where(live, versions, torch.full_like(versions, 99)).min(-1).values
    assert torch.equal(batch.batch["weight_version"], oldest)
    for uid, prompt, mask in zip(batch.non_tensor["uid"], batch.batch["prompts"], batch.batch["attention_mask"], strict=True):
        assert prompt[mask[: prompt.shape[0]].bool()].tolist() == stream.prompts[uid]
    metrics = carry.metrics()
    assert metrics["async/carried_rows_frac"] > 0 and metrics["async/carry_rounds"] >= 2


def test_rows_older_than_the_bound_start_over_and_nothing_drawn_is_lost_or_handed_out_twice(engine):
    weights = _weights(engine)
    workers, stream = Workers(engine, weights), Stream()
    carry = _carry(workers, stream)
    first = carry.generate_sequences(_request(stream, seed=1))
    waiting = {str(u) for u in carry.untrained().non_tensor["uid"]}
    assert waiting, "rows in flight after the first batch"
    workers.hold(2)
    carry.required = 2  # nothing of version 1 may be handed out any more
    before = len(workers.stops)
    second = carry.generate_sequences(_request(stream, seed=3))
    live = second.batch["response_mask"].bool()
    assert second.batch["token_versions"][live].eq(2).all()
    assert carry.metrics()["async/restarted_rows"] > 0
    # a round holding a row that started over runs it to the end (not cut): no row starts over twice
    assert set(workers.stops[:before]) == {0.5} and workers.stops[before] == 0.0
    handed = [str(u) for u in first.non_tensor["uid"][::N]] + [str(u) for u in second.non_tensor["uid"][::N]]
    assert len(handed) == len(set(handed)), "a prompt handed out twice"
    left = [str(u) for u in carry.untrained().non_tensor["uid"]]
    assert sorted(handed + left) == sorted(stream.prompts), "every prompt drawn is handed out or kept"


CARRY = 'mode = "async"\nmax_staleness = 2\npartial_rollouts = "carry"\nlog_samples = 64\nlog_samples_every = 1\n'
ASSET = Path(__file__).resolve().parents[2] / "profiles" / "assets" / "tiny-1m-longtail-sft"


def _longtail_profile(tmp_path: Path, name: str) -> Path:
    """The tiny test profile on the long-tail task with the model made for it: responses of 2 to
    24 tokens, so rounds are cut and rows carried."""
    text = TINY_RL.format(
        name=name, vendor="cpu", out=tmp_path / "runs", backend="inprocess", model=ASSET, preset="grpo",
        steps=6, kl="false", actor="",
    )
    text = text.replace('train = "builtin:addition"', 'train = "builtin:longtail"\nmax_prompt_length = 112')
    text = text.replace("max_new_tokens = 4", "max_new_tokens = 24")
    path = tmp_path / f"{name}.toml"
    path.write_text(text + CARRY)
    return path


def _carried(checkpoint: Path) -> set[str]:
    if not (checkpoint / "carried").is_dir():
        return set()
    record = json.loads((checkpoint / "carried" / "prompts.json").read_text())
    return set(record["non_tensor"]["uid"]["values"])


@pytest.mark.timeout(600)
def test_killed_async_run_with_carried_rollouts_resumes_with_each_prompt_trained_once(tmp_path):
    profile = _longtail_profile(tmp_path, "broken")
    run_dir = tmp_path / "runs/broken"
    ckpt = run_dir / "checkpoints/step_000002"
    kill_at_checkpoint(profile, ckpt)  # rows in flight, carried between rounds
    waiting = _carried(ckpt)
    assert waiting, "the step-2 checkpoint keeps the prompts drawn but not trained"

    proc = rlctl("train", str(profile), "--resume", "auto")
    _, err = proc.communicate(timeout=500)
    assert proc.returncode == 0, err
    steps = by_step(metrics(run_dir))
    assert sorted(steps) == list(range(7)), "metrics.jsonl must hold each step exactly once"
    assert any(steps[s]["async/carried_rows_frac"] > 0 for s in range(1, 7)), "rows were carried"
    assert all(steps[s]["async/staleness_max"] <= 2 for s in range(1, 7))
    trained = {step: set(uids) for step, uids in trained_by_step(run_dir, "uid").items()}
    flat = [u for s in range(1, 7) for u in trained[s]]
    assert len(flat) == len(set(flat)) == 6 * 4, "no prompt trained twice"
    assert not waiting & (trained[1] | trained[2]), "what step 2 kept was not trained yet"
    later = set().union(*(trained[s] for s in range(3, 7))) | _carried(run_dir / "checkpoints/step_000006")
    assert waiting <= later, "every prompt kept at step 2 is trained after the resume, or still kept"
