"""With ``actor.skip_zero_advantage`` on, the update's metrics are still the whole batch's: the
skipped rows' exact contributions are counted (their forward runs without grad), and
``zero_grad_row_frac`` is the batch's share of skipped rows among rows with loss tokens."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from rlctl.dispatch import DataProto
from rlctl.engines.fsdp_train import FSDPTrainEngine
from rlctl.engines.optim import OptimConfig
from rlctl.profile.schema import ActorSection
from rlctl.trainer.plan.specs import ActorLossSpec
from rlctl.trainer.workers.losses import make_actor_loss, zero_gradient_rows
from tests.engines.helpers import make_batch, make_model

REPO = Path(__file__).resolve().parents[2]
COMPARED = ("pg_loss", "pg_clipfrac", "ppo_kl", "entropy", "pg_clipfrac_lower")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model(tmp_path_factory.mktemp("skip") / "model", seed=11)


def _batch(seed: int) -> dict[str, torch.Tensor]:
    """16 rows: half of them a zero advantage everywhere, two padding rows; old log-probs off the
    current policy (so ppo_kl and the clip fractions are not 0) and rollout log-probs beside them."""
    b = make_batch(16, seed=seed)
    g = torch.Generator().manual_seed(seed)
    adv = torch.randn(16, 1, generator=g).expand(-1, b["responses"].shape[1]).clone()
    adv[::2] = 0.0
    b["response_mask"][[3, 8]] = 0  # padding rows: one with a zero advantage, one without
    b["attention_mask"][[3, 8], -b["responses"].shape[1] :] = 0
    b["advantages"] = adv * b["response_mask"]
    lp = -2.0 + 0.5 * torch.randn(b["responses"].shape, generator=g)
    b["old_log_probs"] = lp
    b["rollout_log_probs"] = lp + 0.2 * torch.randn(lp.shape, generator=g)
    return b


@pytest.mark.timeout(300)
@pytest.mark.parametrize("policy_loss", ["vanilla", "cispo", "gspo"])
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
@pytest.mark.parametrize("recomputed", [True, False])
def test_metrics_with_the_skip_equal_the_whole_batch(model_dir, policy_loss, agg, recomputed):
    """``recomputed=False``: no old-log-prob pass, so the loss itself measures the train/rollout gap
    (``rollout/log_prob_diff_mean``, which the gap alarm watches) and the rollout correction."""
    spec = ActorLossSpec(ActorSection(policy_loss=policy_loss, loss_agg_mode=agg, skip_zero_advantage=True))
    loss = make_actor_loss(replace(spec, rollout_correction="token"))
    batch = _batch(3)
    if not recomputed:
        del batch["old_log_probs"]
    optim = OptimConfig(lr=1e-3, grad_clip=0.0, warmup_steps=0, total_steps=4)
    runs = {}
    for skip in (True, False):
        engine = FSDPTrainEngine(model_dir, micro_batch_size=3, optim=optim)
        off = replace(spec, actor=replace(spec.actor, skip_zero_advantage=False))
        rows = zero_gradient_rows(spec if skip else off, batch)
        assert (rows is not None) == skip
        runs[skip] = engine.train_batch(batch, loss, skip_rows=rows)
    on, off = runs[True], runs[False]
    extra = () if recomputed else ("rollout/log_prob_diff_mean", "rollout/log_prob_diff_max", "rollout_corr/kl")
    for key in (*COMPARED, *extra):
        assert on[key] == pytest.approx(off[key], rel=1e-5, abs=1e-9), key
    assert off["entropy"] > 0 and (off["ppo_kl"] != 0) == recomputed
    # 8 of the 14 rows with loss tokens skipped (row 8, a padding row, counts in neither)
    assert on["zero_grad_row_frac"] == pytest.approx(7 / 14) and off["zero_grad_row_frac"] == 0.0
    assert on["metrics_token_frac"] > 0 and off["metrics_token_frac"] == 0.0


def test_kl_loss_and_kl_in_reward_have_a_key_each():
    from rlctl.algorithms.kl import FixedKLController
    from rlctl.engines.optim import LossScale
    from rlctl.profile import load_profile
    from rlctl.trainer.step.stages import compute_advantages

    b = _batch(4)
    ref = b["old_log_probs"] - 0.1
    spec = ActorLossSpec(ActorSection(use_kl_loss=True))
    out = {"log_probs": b["old_log_probs"] + 0.05}
    scale = LossScale(global_tokens=int(b["response_mask"].sum()), global_seqs=14, dp_size=1)
    _, loss_metrics = make_actor_loss(spec)(out, {**b, "ref_log_probs": ref}, scale)
    assert "kl_loss" in loss_metrics and "kl" not in loss_metrics
    algo = load_profile(REPO / "profiles/tiny-cpu.toml", ["algorithm.use_kl_in_reward=true"]).algorithm
    tensors = {
        "token_level_scores": b["advantages"],
        "old_log_probs": b["old_log_probs"],
        "ref_log_probs": ref,
        "response_mask": b["response_mask"],
        "rollout_log_probs": b["rollout_log_probs"],
    }
    uid = np.array([f"p{i // 4}" for i in range(16)], dtype=object)
    _, metrics = compute_advantages(
        DataProto.from_dict(tensors=tensors, non_tensors={"uid": uid}), algo, FixedKLController(0.1)
    )
    assert {"actor/reward_kl_penalty", "actor/reward_kl_penalty_coeff"} <= set(metrics)
    assert "actor/kl" not in metrics
