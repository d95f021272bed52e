"""Training metrics are the mini-batch's: a 7-row batch cut into micro-batches of 1, 3 and 16 rows
on 1 and 2 gloo ranks (with the padding row that makes 7 rows divide over 2 ranks) reports the
entropy, means, maxima and minima of the whole batch, not means of micro-batch means."""

from __future__ import annotations

import math
import os

import pytest
import torch

from rlctl.algorithms.metric_parts import EffectiveSampleSize, Max, Mean, Min, merge, result, results
from rlctl.dispatch.local_ranks import spawn_ranks
from rlctl.engines.batch_metrics import BatchMetrics
from tests.engines.helpers import make_batch, make_model

MICRO_BATCHES = (1, 3, 16)
TOL = 1e-5


def _batch(padded: bool) -> dict[str, torch.Tensor]:
    """7 rows of varied response lengths with advantages and rollout log-probs; ``padded`` adds an
    8th row without response tokens, as the driver pads a batch to divide over the ranks."""
    batch = make_batch(7, prompt_len=6, resp_len=5, seed=11)
    g = torch.Generator().manual_seed(12)
    batch["advantages"] = torch.randn(batch["responses"].shape, generator=g)
    batch["rollout_log_probs"] = -3.0 + 0.6 * torch.randn(batch["responses"].shape, generator=g)
    if padded:
        batch = {k: torch.cat([v, v[:1]]) for k, v in batch.items()}
        batch["response_mask"][-1] = 0
    return batch


def _train(engine, batch: dict[str, torch.Tensor]) -> dict[int, dict[str, float]]:
    from rlctl.trainer.plan.specs import ActorLossSpec
    from rlctl.trainer.workers.losses import make_actor_loss

    loss = make_actor_loss(ActorLossSpec(rollout_correction="token"))
    out = {}
    for mbs in MICRO_BATCHES:
        engine.micro_batch_size = mbs
        out[mbs] = engine.train_batch(batch, loss)
    return out


def _engine(model_dir: str):
    from rlctl.engines.fsdp_train import FSDPTrainEngine
    from rlctl.engines.optim import OptimConfig

    # lr 0: the weights, so the metrics' model, stay fixed over the three calls
    return FSDPTrainEngine(model_dir, optim=OptimConfig(lr=0.0, weight_decay=0.0, grad_clip=0.0))


def _rank(rank: int, world: int, port: int, model_dir: str, out_dir: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        per_rank = 8 // world
        shard = {k: v[rank * per_rank : (rank + 1) * per_rank] for k, v in _batch(padded=True).items()}
        torch.save(_train(_engine(model_dir), shard), os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def reported(tmp_path_factory):
    """Metrics per (run, micro-batch size): one plain process on 7 and on 8 (padded) rows, and
    the padded batch over 2 gloo ranks; plus the model directory."""
    from rlctl.dispatch.worker import free_port

    base = tmp_path_factory.mktemp("batch_metrics")
    model_dir = str(make_model(base / "model", seed=4))
    runs = {"plain-7": _train(_engine(model_dir), _batch(False))}
    runs["plain-8"] = _train(_engine(model_dir), _batch(True))
    spawn_ranks(_rank, 2, (2, free_port(), model_dir, str(base)))
    ranks = [torch.load(base / f"rank{r}.pt") for r in range(2)]
    assert ranks[0] == ranks[1]  # every rank reports the same, all-reduced values
    runs["world-2"] = ranks[0]
    return model_dir, runs


def _whole_batch(model_dir: str) -> dict[str, float]:
    """The metrics of the 7 rows as one batch, written out from a plain forward."""
    from rlctl.algorithms import rollout_is_weights

    batch = _batch(False)
    out = _engine(model_dir).compute_log_prob(batch, with_entropy=True, micro_batch_size=7)
    lp, ent, mask = out["log_probs"], out["entropy"], batch["response_mask"].bool()
    gap = (lp - batch["rollout_log_probs"]).abs()
    _, corr = rollout_is_weights(lp, batch["rollout_log_probs"], batch["response_mask"], level="token")
    ratio = torch.exp(lp - batch["rollout_log_probs"])[mask].clamp(max=2.0)
    assert corr["rollout_is_max"] == pytest.approx(float(ratio.max()), rel=1e-6)
    want = {f"rollout_corr/{k}": v for k, v in corr.items()}
    want.update(
        {
            "entropy": float(ent[mask].mean()),
            "rollout/log_prob_diff_mean": float(gap[mask].mean()),
            "rollout/log_prob_diff_max": float(gap[mask].max()),
            "rollout_corr/rollout_is_min": float(ratio.min()),
            "pg_loss": float(-batch["advantages"][mask].mean()),  # ratio 1: old = current policy
            "ppo_kl": 0.0,
        }
    )
    return want


@pytest.mark.timeout(300)
@pytest.mark.parametrize("run", ["plain-7", "plain-8", "world-2"])
@pytest.mark.parametrize("mbs", MICRO_BATCHES)
def test_metrics_are_the_whole_batch_values(reported, run: str, mbs: int) -> None:
    model_dir, runs = reported
    want, got = _whole_batch(model_dir), runs[run][mbs]
    assert want["rollout_corr/rollout_is_max"] > want["rollout_corr/rollout_is_mean"] + 0.1
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=TOL, abs=TOL), (key, got[key], value)


def test_parts_of_pieces_combine_into_the_parts_of_the_whole() -> None:
    g = torch.Generator().manual_seed(0)
    values, mask = torch.rand(9, 4, generator=g), (torch.rand(9, 4, generator=g) > 0.4).float()
    mask[3] = 0  # a padding row: its piece is empty
    acc = BatchMetrics()
    for rows in (slice(0, 1), slice(1, 4), slice(4, 4), slice(4, 9)):  # an empty piece too
        v, m = values[rows], mask[rows]
        picked = v[m.bool()]
        acc.add(
            {
                "mean": Mean(float((v * m).sum()), float(m.sum())),
                "max": Max(float(picked.max()) if picked.numel() else -math.inf),
                "min": Min(float(picked.min()) if picked.numel() else math.inf),
                "ess": EffectiveSampleSize(float((v * m).sum()), float((v * v * m).sum()), float(m.sum())),
            }
        )
    got = results(acc.reduce())
    picked = values[mask.bool()]
    assert got["mean"] == pytest.approx(float(picked.mean()), rel=1e-6)
    assert got["max"] == float(picked.max()) and got["min"] == float(picked.min())
    assert got["ess"] == pytest.approx(float(picked.mean() ** 2 / (picked**2).mean()), rel=1e-6)
    assert result(Mean(0.0, 0.0)) == result(Max(-math.inf)) == result(Min(math.inf)) == 0.0
    with pytest.raises(TypeError, match="Mean and Max"):
        merge(Mean(1.0, 1.0), Max(1.0))
