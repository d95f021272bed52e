"""Delta weight pushes (``rollout.delta_sync``) with the rollout copy in bf16: colocated syncs and
the off-policy pushes send only the changed elements, every push still passes the fingerprint, the
first push of a process (start, resume) and a version gap are full, and a planted wrong delta stops
the run at that push naming the rank."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import rlctl.trainer.workers.delta_push as delta_push
from rlctl.engines.hf_rollout import HFRolloutEngine
from rlctl.errors import RunError
from rlctl.trainer.workers.delta_push import DeltaPublisher
from rlctl.trainer.workers.rollout import RolloutWorker
from rlctl.trainer.workers.weight_streams import PublishedWeights
from tests.cli_runner import run_cli
from tests.trainer.test_train_e2e import by_step, metrics

BF16 = ("--set", "platform.dtype=bfloat16", "--set", "rollout.delta_sync=true")


class RecordingRollout(HFRolloutEngine):
    """The HF engine, recording which way each weight load came: 'full' or 'delta' (a push's
    deltas come in one call; a colocated sync's tensor by tensor, recorded once by :func:`_record`)."""

    loads: list[str] = []

    def update_weights(self, stream):
        RecordingRollout.loads.append("full")
        return super().update_weights(stream)

    def apply_deltas(self, deltas):
        deltas = list(deltas)
        if len(deltas) > 1:
            RecordingRollout.loads.append("delta")
        return super().apply_deltas(deltas)


def _record_colocated(monkeypatch) -> None:
    import rlctl.trainer.workers.roles as roles

    real = roles.colocated_delta_sync

    def recorded(stream, engine):
        RecordingRollout.loads.append("delta")
        return real(stream, engine)

    monkeypatch.setattr(roles, "colocated_delta_sync", recorded)


def _error_line(err: str) -> str:
    return next(line for line in err.splitlines() if line.startswith("rlctl: error:"))


@pytest.mark.timeout(600)
def test_colocated_delta_syncs_are_checked_and_a_resume_starts_full(
    write_profile, tmp_path, rollout_engine_class, monkeypatch
):
    rollout_engine_class(RecordingRollout)
    _record_colocated(monkeypatch)
    RecordingRollout.loads = []
    profile = write_profile("delta", steps=2, entropy_coeff=0.01)
    code, _, err = run_cli("train", str(profile), *BF16, "--set", "trainer.val_every=0")
    assert code == 0, err
    assert RecordingRollout.loads == ["full", "delta", "delta"]  # start, then after steps 1 and 2
    RecordingRollout.loads = []
    profile.write_text(profile.read_text().replace("steps = 2", "steps = 4"))
    code, _, err = run_cli("train", str(profile), *BF16, "--set", "trainer.val_every=0")
    assert code == 0, err
    # the resumed process: its engine's start, the load of the step-2 checkpoint (full), then deltas
    assert RecordingRollout.loads == ["full", "full", "delta", "delta"]
    steps = by_step(metrics(tmp_path / "runs/delta"))
    for s in (1, 2, 3, 4):
        m = steps[s]
        assert m["sync/delta"] == 1.0 and m["sync/fingerprint_ok"] == 1.0, m
        assert 0.0 < m["sync/changed_frac"] <= 1.0
        assert 0 < m["sync/bytes"] <= m["sync/full_bytes"]


def _corrupt_after(n_calls: int, monkeypatch) -> None:
    """Every delta from call ``n_calls`` on gets one value changed after its checksum was taken."""
    real, calls = delta_push.diff, [0]

    def planted(name, new, base):
        d = real(name, new, base)
        calls[0] += 1
        if calls[0] > n_calls and d.values.numel():
            d.values[0] += 1
        return d

    monkeypatch.setattr(delta_push, "diff", planted)


@pytest.mark.timeout(300)
def test_a_planted_wrong_colocated_delta_stops_that_sync_naming_the_rank(
    write_profile, tmp_path, monkeypatch
):
    _corrupt_after(0, monkeypatch)
    profile = write_profile("delta-bad", steps=2, entropy_coeff=0.01)
    code, _, err = run_cli("train", str(profile), *BF16, "--set", "trainer.save_every=0")
    assert code == 1, err
    last = _error_line(err)
    for needle in ("step=1", "method=sync_weights", "weight sync 2", "rank 0", "did not land as sent"):
        assert needle in last, (needle, last)


@pytest.mark.timeout(600)
def test_off_policy_pushes_are_deltas_and_a_wrong_one_stops_naming_the_rank(
    write_profile, tmp_path, monkeypatch, rollout_engine_class
):
    rollout_engine_class(RecordingRollout)
    RecordingRollout.loads = []
    profile = write_profile("delta-push", steps=3, extra='mode = "one_step_off"\n', entropy_coeff=0.01)
    args = ("train", str(profile), *BF16, "--set", "trainer.save_every=0", "--set", "trainer.val_every=0")
    code, _, err = run_cli(*args)
    assert code == 0, err
    steps = by_step(metrics(tmp_path / "runs/delta-push"))
    # batches 1 and 2 are generated with version 1 (the first push: full), batch 3 with 2 (a delta)
    assert steps[1]["sync/delta"] == steps[2]["sync/delta"] == 0.0 and steps[3]["sync/delta"] == 1.0
    assert steps[3]["sync/changed_frac"] < 1.0 and steps[3]["sync/bytes"] < steps[1]["sync/bytes"]
    assert all(steps[s]["sync/fingerprint_ok"] == 1.0 for s in (1, 2, 3))
    assert "delta" in RecordingRollout.loads

    _corrupt_after(0, monkeypatch)  # the publisher's deltas, from the first on
    profile = write_profile("delta-push-bad", steps=3, extra='mode = "one_step_off"\n', entropy_coeff=0.01)
    code, _, err = run_cli(
        "train", str(profile), *BF16, "--set", "trainer.save_every=0", "--set", "trainer.val_every=0"
    )
    assert code == 1, err
    last = _error_line(err)
    for needle in (
        "role=rollout",
        "method=update_weights",
        "weight version 2",
        "rank 0",
        "did not land as sent",
    ):
        assert needle in last, (needle, last)


def test_a_version_gap_asks_for_a_full_push_which_the_publisher_serves(tiny_model):
    """A rollout worker holding version 3 is sent the delta 4 -> 5: it asks for a full push; the
    publisher's full copy of version 5 then loads and passes the fingerprint."""
    engine = HFRolloutEngine(tiny_model, dtype="bfloat16")
    worker = RolloutWorker.__new__(RolloutWorker)
    worker._rlctl_ctx = SimpleNamespace(rank=0)
    worker.spec = SimpleNamespace(engine=SimpleNamespace(device_type="cpu"))
    worker.rollout, worker.version = engine, 3
    weights = {n: t.detach().float().clone() for n, t in engine.local_tensors().items()}
    publisher = DeltaPublisher(torch.bfloat16)
    for v in (4, 5):
        weights = {n: t + 1e-4 * torch.randn_like(t) for n, t in weights.items()}
        full, deltas, base, samples = publisher.publish(weights.items(), v, salt=v)
    assert base == 4 and not full and any(d.index is not None for d in deltas)
    gap = worker.update_weights(
        PublishedWeights(full, deltas=deltas, base_version=base, samples=samples, version=5), 5
    )
    assert gap == {"sync/need_full": 1.0, "sync/held_version": 3.0} and worker.version == 3
    whole, version = publisher.full()
    out = worker.update_weights(PublishedWeights(whole, version=version), version)
    assert worker.version == 5 and out["sync/fingerprint_ok"] == 1.0 and out["sync/delta"] == 0.0
    for name, t in engine.local_tensors().items():
        assert torch.equal(t, weights[name].to(torch.bfloat16)), name
    # the next version's delta now applies
    weights = {n: t + 1e-4 * torch.randn_like(t) for n, t in weights.items()}
    full, deltas, base, samples = publisher.publish(weights.items(), 6, salt=6)
    out = worker.update_weights(
        PublishedWeights(full, deltas=deltas, base_version=base, samples=samples, version=6), 6
    )
    assert out["sync/delta"] == 1.0 and out["sync/fingerprint_ok"] == 1.0 and worker.version == 6
    with pytest.raises(RunError, match="rank 0"):
        weights = {n: t + 1e-4 * torch.randn_like(t) for n, t in weights.items()}
        full, deltas, base, samples = publisher.publish(weights.items(), 7, salt=7)
        deltas[0].values[0] += 1
        worker.update_weights(
            PublishedWeights(full, deltas=deltas, base_version=base, samples=samples, version=7), 7
        )
