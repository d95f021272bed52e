"""The LR schedule counts RL steps (as verl does): warmup and cosine do not depend on how many
mini-batches (optimiser steps) a step holds, and the schedule's length is the run's step count."""

from __future__ import annotations

import math

import pytest
import torch

from rlctl.dispatch import Dispatch, Execute, Mesh
from rlctl.dispatch.modes import get_mode, plan_call
from rlctl.dispatch.worker import WorkerContext, WorkerHost
from rlctl.engines.optim import OptimConfig, lr_lambda
from rlctl.profile.schema import ActorSection
from rlctl.trainer.plan.specs import ActorLossSpec, EngineSpec, PolicySpec, build_specs
from rlctl.trainer.step.minibatch import layout_mini_batches
from rlctl.trainer.step.stages import for_workers
from rlctl.trainer.workers.roles import PolicyWorker
from tests.engines.helpers import make_model
from tests.trainer.test_world_size_invariance import make_step_batch

LR = 1e-3
OPTIM = OptimConfig(lr=LR, warmup_steps=2, total_steps=6, schedule="cosine", min_lr_ratio=0.1)
STEPS = 6


def policy_host(model_dir: str) -> WorkerHost:
    spec = PolicySpec(
        engine=EngineSpec(model_path=model_dir),
        optim=OPTIM,
        loss=ActorLossSpec(ActorSection(skip_zero_advantage=False, ppo_epochs=2, micro_batch_sequences=4)),
    )
    host = WorkerHost(0, 1, in_process=True)
    ctx = WorkerContext("policy", 0, 1, 0, 1, Mesh.of(None, 1), "127.0.0.1", 0, in_process=True)
    host.add_role(PolicyWorker, {"spec": spec}, ctx)
    host.call("policy", "init_model", (), {})
    return host


def lrs_per_rl_step(host: WorkerHost, mini_batch_prompts: int) -> list[list[float]]:
    """The LR of every optimiser step, grouped by RL step, over a short run."""
    engine = host.workers["policy"].actor
    seen: list[float] = []
    engine.optimizer.register_step_pre_hook(lambda opt, args, kwargs: seen.append(opt.param_groups[0]["lr"]))
    out = []
    for step in range(STEPS):
        batch, uids = make_step_batch([2, 2, 2, 2], seed=step)
        laid = layout_mini_batches(for_workers(batch), uids, mini_batch_prompts, 1)
        payload, _ = plan_call(
            get_mode(Dispatch.DP_COMPUTE_METRICS), Execute.ALL, Mesh.of(None, 1), (laid,), {}
        )
        seen.clear()
        host.call("policy", "update_actor", *payload[0])
        out.append(list(seen))
    return out


@pytest.mark.timeout(240)
def test_warmup_and_cosine_land_on_the_same_rl_steps_for_1_and_4_mini_batches(tmp_path):
    model_dir = str(make_model(tmp_path / "m", seed=2))
    one = lrs_per_rl_step(policy_host(model_dir), mini_batch_prompts=4)  # 1 mini-batch per step
    four = lrs_per_rl_step(policy_host(model_dir), mini_batch_prompts=1)  # 4 mini-batches per step
    want = [LR * lr_lambda(OPTIM)(s) for s in range(STEPS)]
    assert [len(s) for s in one] == [2] * STEPS and [len(s) for s in four] == [8] * STEPS  # x ppo_epochs
    for step in range(STEPS):
        assert one[step] == pytest.approx([want[step]] * 2, rel=1e-12)
        assert four[step] == pytest.approx([want[step]] * 8, rel=1e-12)
    # verl's warmup: RL steps 1 and 2 at 0 and LR/2, the cosine starts at LR on RL step 3 and
    # decays to RL step 6, for both
    assert want[0] == 0.0 and want[1] == pytest.approx(LR / 2) and want[2] == pytest.approx(LR)
    assert all(a > b for a, b in zip(want[2:], want[3:], strict=False))
    assert want[-1] == pytest.approx(LR * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 3 / 4))))


def test_schedule_length_is_the_run_and_the_critic_normalises_like_the_actor(tmp_path):
    from rlctl.profile import load_profile

    profile = tmp_path / "p.toml"
    profile.write_text(
        f"""
[model]
path = "{tmp_path}"
[algorithm]
preset = "ppo"
[actor]
mini_batch_prompts = 2
ppo_epochs = 3
warmup_steps = 4
lr_schedule = "cosine"
loss_agg_mode = "seq-mean-token-sum-norm"
[rollout]
max_new_tokens = 48
[trainer]
steps = 50
prompts_per_step = 8
"""
    )
    specs = build_specs(
        load_profile(profile), device_type="cpu", dtype="float32", attn="sdpa", dist_backend="gloo"
    )
    assert specs.policy.optim.total_steps == 50  # RL steps, not 50 x 3 epochs x 4 mini-batches
    assert specs.policy.optim.warmup_steps == 4
    assert specs.critic.optim.total_steps == 50
    assert specs.critic.norm_constant == specs.policy.loss.norm_constant == 48.0


def test_critic_seq_mean_token_sum_norm_does_not_follow_the_trimmed_width():
    """The same rows at two response widths (trim_response_padding changes it per step) give one loss."""
    from rlctl.engines.optim import LossScale
    from rlctl.trainer.plan.specs import CriticSpec
    from rlctl.trainer.workers.losses import make_critic_loss

    spec = CriticSpec(
        engine=EngineSpec(model_path="-"),
        optim=OptimConfig(),
        loss_agg_mode="seq-mean-token-sum-norm",
        norm_constant=8.0,
    )
    loss_fn = make_critic_loss(spec)
    g = torch.Generator().manual_seed(0)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    cols = {k: torch.randn(2, 3, generator=g) for k in ("vpred", "returns", "values")}

    def loss_at(width: int) -> float:
        pad = width - 3
        mb = {
            "response_mask": torch.nn.functional.pad(mask, (0, pad)),
            "returns": torch.nn.functional.pad(cols["returns"], (0, pad)),
            "values": torch.nn.functional.pad(cols["values"], (0, pad)),
        }
        out = {"values": torch.nn.functional.pad(cols["vpred"], (0, pad))}
        return float(loss_fn(out, mb, LossScale(global_tokens=3, global_seqs=2, dp_size=1))[0])

    assert loss_at(3) == pytest.approx(loss_at(8), rel=1e-6)
