"""Parity with verl's own ``core_algos`` on random inputs (skipped when verl is not importable).

Install for these: ``pip install --no-deps verl==0.9.1 omegaconf hydra-core codetiming orjson
tensordict pyvers cloudpickle``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")
rollout_corr = pytest.importorskip("verl.trainer.ppo.rollout_corr_helper")
verl_F = pytest.importorskip("verl.utils.torch_functional")
from verl.trainer.config import AlgoConfig  # noqa: E402
from verl.workers.config import ActorConfig  # noqa: E402

from rlctl.algorithms import (  # noqa: E402
    AdaptiveKLController,
    PolicyLossConfig,
    agg_loss,
    get_adv_estimator,
    get_policy_loss,
    kl_penalty,
    masked_whiten,
    rollout_is_weights,
    value_loss,
)

SEEDS = range(5)
MODES = ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


def _batch(seed: int, bsz: int = 12, length: int = 7, group: int = 3, singletons: bool = True):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, length + 1, (bsz,), generator=g)
    mask = (torch.arange(length)[None, :] < lengths[:, None]).float()
    rewards = torch.zeros(bsz, length)
    scores = torch.randint(0, 3, (bsz,), generator=g).float() - (seed % 2) * 0.5
    rewards[torch.arange(bsz), lengths - 1] = scores
    labels = [f"p{i // group}" for i in range(bsz)]
    if singletons:
        labels[-1] = "lonely"
    index = np.array(labels, dtype=object)
    return rewards, mask, index, g


def _close(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name", ["grpo", "rloo", "opo", "gpg", "reinforce_plus_plus_baseline"])
def test_group_estimators_match_verl(name: str, seed: int) -> None:
    rewards, mask, index, _ = _batch(seed)
    ours = get_adv_estimator(name)(token_level_rewards=rewards.clone(), response_mask=mask, index=index)
    theirs = core_algos.get_adv_estimator_fn(name)(
        token_level_rewards=rewards.clone(), response_mask=mask, index=index
    )
    _close(ours[0], theirs[0])
    _close(ours[1], theirs[1])


@pytest.mark.parametrize("norm", [True, False])
def test_grpo_dr_grpo_flag_matches_verl(norm: bool) -> None:
    rewards, mask, index, _ = _batch(7)
    ours, _ = get_adv_estimator("grpo")(rewards.clone(), mask, index=index, norm_adv_by_std_in_grpo=norm)
    theirs, _ = core_algos.compute_grpo_outcome_advantage(
        rewards.clone(), mask, index, norm_adv_by_std_in_grpo=norm
    )
    _close(ours, theirs)


@pytest.mark.parametrize("seed", SEEDS)
def test_gae_matches_verl(seed: int) -> None:
    rewards, mask, _, g = _batch(seed)
    rewards = rewards + 0.1 * torch.randn(rewards.shape, generator=g) * mask
    values = torch.randn(rewards.shape, generator=g)
    mask[0, 2] = 0.0  # a hole: an observation token in the middle
    ours = get_adv_estimator("gae")(
        token_level_rewards=rewards, values=values, response_mask=mask, gamma=0.95, lam=0.9
    )
    theirs = core_algos.compute_gae_advantage_return(rewards, values, mask, gamma=0.95, lam=0.9)
    _close(ours[0], theirs[0])
    _close(ours[1], theirs[1])


@pytest.mark.parametrize("seed", SEEDS)
def test_reinforce_pp_and_remax_match_verl(seed: int) -> None:
    rewards, mask, _, g = _batch(seed)
    rewards = rewards + 0.1 * torch.randn(rewards.shape, generator=g) * mask
    mask[1, 0] = 0.0
    ours = get_adv_estimator("reinforce_plus_plus")(rewards, mask, config=AlgoConfig(gamma=0.9))
    theirs = core_algos.compute_reinforce_plus_plus_outcome_advantage(
        rewards, mask, config=AlgoConfig(gamma=0.9)
    )
    _close(ours[0], theirs[0])
    _close(ours[1], theirs[1])
    baselines = torch.randn(rewards.shape[0], generator=g)
    ours = get_adv_estimator("remax")(
        token_level_rewards=rewards, reward_baselines=baselines, response_mask=mask
    )
    theirs = core_algos.compute_remax_outcome_advantage(rewards, baselines, mask)
    _close(ours[0], theirs[0])
    _close(ours[1], theirs[1])


def test_masked_whiten_matches_verl() -> None:
    g = torch.Generator().manual_seed(0)
    x, mask = torch.randn(5, 6, generator=g), (torch.rand(5, 6, generator=g) > 0.4).float()
    _close(masked_whiten(x, mask), verl_F.masked_whiten(x, mask))


def _policy_inputs(seed: int, length: int = 9):
    rewards, mask, _, g = _batch(seed, length=length)
    old = -torch.rand(mask.shape, generator=g) * 3
    lp = (old + 0.4 * torch.randn(mask.shape, generator=g)).requires_grad_(True)
    adv = torch.randn(mask.shape, generator=g)
    isw = torch.rand(mask.shape, generator=g) * 2
    mask[2] = 0.0  # an empty row
    return old, lp, adv, mask, isw


def _actor_config(mode: str, info: dict | None = None) -> ActorConfig:
    cfg = ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        clip_ratio=0.2,
        clip_ratio_low=0.2,
        clip_ratio_high=0.28,
        clip_ratio_c=3.0,
        loss_agg_mode=mode,
    )
    cfg.global_batch_info.update(info or {})
    return cfg


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", ["vanilla", "gspo", "cispo", "gpg"])
@pytest.mark.parametrize("with_is", [False, True])
def test_policy_losses_match_verl(name: str, mode: str, seed: int, with_is: bool) -> None:
    old, lp, adv, mask, isw = _policy_inputs(seed)
    weights = isw if with_is else None
    lp2 = lp.detach().clone().requires_grad_(True)
    cfg = PolicyLossConfig(clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.28, loss_agg_mode=mode)
    ours, om = get_policy_loss(name)(old, lp, adv, mask, mode, cfg, weights)
    theirs, tm = core_algos.get_policy_loss_fn(name)(old, lp2, adv, mask, mode, _actor_config(mode), weights)
    _close(ours, theirs)
    ours.backward()
    theirs.backward()
    _close(lp.grad, lp2.grad)
    for key, value in tm.items():
        assert om[key.removeprefix("actor/")] == pytest.approx(value, rel=1e-5, abs=1e-7)


@pytest.mark.parametrize("mode", MODES)
def test_agg_loss_matches_verl_local_and_global(mode: str) -> None:
    old, lp, adv, mask, _ = _policy_inputs(3)
    loss = adv * lp.detach()
    _close(agg_loss(loss, mask, mode), core_algos.agg_loss(loss, mask, mode))
    seqs = float((mask.sum(-1) > 0).sum())
    ours = agg_loss(loss, mask, mode, global_tokens=mask.sum() * 2, global_seqs=seqs * 2, dp_size=2)
    theirs = core_algos.agg_loss(
        loss, mask, mode, dp_size=2, batch_num_tokens=mask.sum() * 2, global_batch_size=seqs * 2
    )
    _close(ours, theirs)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_value_loss_matches_verl(mode: str) -> None:
    g = torch.Generator().manual_seed(1)
    vpreds, returns, values = (torch.randn(6, 5, generator=g) for _ in range(3))
    mask = (torch.rand(6, 5, generator=g) > 0.3).float()
    ours, om = value_loss(vpreds, returns, values, mask, 0.2, mode)
    theirs, clipfrac = core_algos.compute_value_loss(vpreds, returns, values, mask, 0.2, mode)
    _close(ours, theirs)
    assert om["vf_clipfrac"] == pytest.approx(clipfrac.item())


@pytest.mark.parametrize(
    "kind", ["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3", "k1+", "k3+", "low_var_kl+"]
)
def test_kl_penalty_matches_verl_value_and_grad(kind: str) -> None:
    g = torch.Generator().manual_seed(2)
    lp = (-torch.rand(4, 6, generator=g) * 4).requires_grad_(True)
    ref = -torch.rand(4, 6, generator=g) * 4
    lp2 = lp.detach().clone().requires_grad_(True)
    ours, theirs = kl_penalty(lp, ref, kind), core_algos.kl_penalty(lp2, ref, kind)
    _close(ours, theirs)
    ours.sum().backward()
    theirs.sum().backward()
    _close(lp.grad, lp2.grad)


def test_adaptive_kl_controller_matches_verl() -> None:
    ours, theirs = AdaptiveKLController(0.1, 0.05, 1000), core_algos.AdaptiveKLController(0.1, 0.05, 1000)
    for kl in [0.01, 0.2, 0.06, 0.0, 0.049]:
        ours.update(kl, 64)
        theirs.update(kl, 64)
        assert ours.value == pytest.approx(theirs.value, rel=1e-12)


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("mode", ["truncate", "mask"])
def test_rollout_is_weights_match_verl(level: str, mode: str) -> None:
    g = torch.Generator().manual_seed(4)
    old = -torch.rand(6, 8, generator=g) * 2
    rollout = old + 0.3 * torch.randn(6, 8, generator=g)
    mask = (torch.rand(6, 8, generator=g) > 0.25).float()
    threshold = 2.0 if level == "token" else 5.0
    spec = threshold if mode == "truncate" else f"{0.5}_{threshold}"
    ours, om = rollout_is_weights(
        old,
        rollout,
        mask,
        level=level,
        mode=mode,
        threshold=threshold,
        threshold_lower=0.5 if mode == "mask" else None,
    )
    theirs, tm = rollout_corr.compute_rollout_correction_weights(old - rollout, mask, level, spec)
    _close(ours, theirs)
    for key in ["rollout_is_mean", "rollout_is_max", "rollout_is_min", "rollout_is_eff_sample_size"]:
        assert om[key] == pytest.approx(tm[key], rel=1e-5), key
    if level == "token":
        for key in ["rollout_is_ratio_fraction_high", "rollout_is_ratio_fraction_low"]:
            assert om[key] == pytest.approx(tm[key], rel=1e-5), key


def _verl_apply_kl_penalty():
    """verl's ``ray_trainer.apply_kl_penalty``, compiled from its source: importing ``ray_trainer``
    needs verl's whole data stack (torchdata, datasets, ...), which the function does not use."""
    import ast
    import importlib.util
    import pathlib

    from verl.protocol import DataProto

    path = pathlib.Path(importlib.util.find_spec("verl.trainer.ppo").origin).parent / "ray_trainer.py"
    tree = ast.parse(path.read_text())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "apply_kl_penalty")
    namespace = {
        "torch": torch,
        "core_algos": core_algos,
        "masked_mean": verl_F.masked_mean,
        "DataProto": DataProto,
    }
    exec(compile(ast.Module(body=[fn], type_ignores=[]), str(path), "exec"), namespace)
    return namespace["apply_kl_penalty"], DataProto


@pytest.mark.parametrize("kind", ["kl", "low_var_kl", "abs"])
@pytest.mark.parametrize("adaptive", [False, True])
def test_apply_kl_penalty_matches_verl(kind: str, adaptive: bool) -> None:
    from rlctl.algorithms import FixedKLController, apply_kl_penalty

    verl_apply_kl_penalty, DataProto = _verl_apply_kl_penalty()

    g = torch.Generator().manual_seed(5)
    scores = torch.randn(6, 5, generator=g)
    old, ref = -torch.rand(6, 5, generator=g), -torch.rand(6, 5, generator=g)
    mask = (torch.rand(6, 5, generator=g) > 0.3).float()
    mask[0] = 0.0
    if adaptive:
        ours_ctrl, theirs_ctrl = (
            AdaptiveKLController(0.2, 0.01, 100),
            core_algos.AdaptiveKLController(0.2, 0.01, 100),
        )
    else:
        ours_ctrl, theirs_ctrl = FixedKLController(0.2), core_algos.FixedKLController(0.2)
    for _ in range(3):
        data = DataProto.from_dict(
            tensors={
                "response_mask": mask,
                "token_level_scores": scores,
                "old_log_probs": old,
                "ref_log_prob": ref,
            }
        )
        data, tm = verl_apply_kl_penalty(data, theirs_ctrl, kind)
        rewards, om = apply_kl_penalty(scores, old, ref, mask, ours_ctrl, kind)
        _close(rewards, data.batch["token_level_rewards"])
        assert om["reward_kl_penalty"] == pytest.approx(tm["actor/reward_kl_penalty"], rel=1e-6)
        assert om["reward_kl_penalty_coeff"] == pytest.approx(tm["actor/reward_kl_penalty_coeff"], rel=1e-12)
        assert ours_ctrl.value == pytest.approx(theirs_ctrl.value, rel=1e-12)


def test_response_mask_from_ids_matches_verl() -> None:
    from rlctl.algorithms import response_mask_from_ids

    g = torch.Generator().manual_seed(6)
    ids = torch.randint(0, 5, (8, 10), generator=g)
    for eos in (1, [1, 2]):
        assert torch.equal(response_mask_from_ids(ids, eos), verl_F.get_response_mask(ids, eos))
