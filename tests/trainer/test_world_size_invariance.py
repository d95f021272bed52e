"""The same update on any number of ranks: world 1 and world 2 take the same optimiser steps.

The real update path: the driver's mini-batch layout, the DP_COMPUTE_METRICS dispatch,
``PolicyWorker.update_actor`` / ``CriticWorker.update_critic`` and FSDP2 over gloo. Batch sizes
that do not divide the ranks, random response lengths, all four loss aggregation modes and
micro-batch sizes 1..8. Every optimiser step's gradient must equal world 1's and the gradient of
verl's formulas (rlctl.algorithms, parity-tested against verl in tests/algorithms) on that
mini-batch as a whole in one plain process, to 1e-5 relative. ``lr = 0`` keeps the weights fixed,
so one long-lived 2-rank group serves every example.
"""

from __future__ import annotations

import queue
import shutil
import traceback
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
from hypothesis import example, given, settings
from hypothesis import strategies as st

from rlctl.algorithms import LOSS_AGG_MODES
from tests.engines.helpers import EOS, PAD, VOCAB, make_model

WIDTH = 6  # response columns (max_new_tokens): the seq-mean-token-sum-norm constant
TEMPERATURE = 0.8
TOL = 1e-5


# ---- the run on one group -------------------------------------------------------------------------


def _specs(actor_dir: str, critic_dir: str):
    from rlctl.engines.optim import OptimConfig
    from rlctl.profile.schema import ActorSection, CriticSection, RolloutSection
    from rlctl.trainer.plan.specs import ActorLossSpec, CriticSpec, EngineSpec, PolicySpec, RolloutSpec

    optim = OptimConfig(lr=0.0, weight_decay=0.0, grad_clip=0.0)
    policy = PolicySpec(
        engine=EngineSpec(model_path=actor_dir),
        optim=optim,
        loss=ActorLossSpec(
            ActorSection(
                clip_ratio_low=0.2,
                clip_ratio_high=0.28,
                entropy_coeff=0.01,
                use_kl_loss=True,
                kl_loss_coef=0.1,
                skip_zero_advantage=False,
                micro_batch_sequences=4,
            ),
            norm_constant=float(WIDTH),
        ),
        rollout=RolloutSpec(section=RolloutSection(temperature=TEMPERATURE)),
    )
    critic = CriticSpec(
        engine=EngineSpec(model_path=critic_dir),
        optim=optim,
        section=CriticSection(cliprange_value=0.2, micro_batch_sequences=4),
        norm_constant=float(WIDTH),
    )
    return policy, critic


class Group:
    """Policy and critic workers of one world size, in this process (world 1) or a rank process."""

    def __init__(self, rank: int, world: int, port: int, actor_dir: str, critic_dir: str) -> None:
        from rlctl.dispatch.mesh import Mesh
        from rlctl.dispatch.worker import WorkerContext, WorkerHost
        from rlctl.trainer.workers.roles import CriticWorker, PolicyWorker

        self.policy_spec, self.critic_spec = _specs(actor_dir, critic_dir)
        self.host = WorkerHost(rank, world, in_process=world == 1)
        mesh = Mesh.of({"dp": world}, world)
        for role, cls, spec in (
            ("policy", PolicyWorker, self.policy_spec),
            ("critic", CriticWorker, self.critic_spec),
        ):
            ctx = WorkerContext(
                role, rank, world, rank, world, mesh, "127.0.0.1", port, in_process=world == 1
            )
            self.host.add_role(cls, {"spec": spec}, ctx)
            self.host.call(role, "init_model", (), {})
        self.grads: list[dict[str, torch.Tensor]] = []
        for engine in (self.policy.actor, self.critic.critic):
            engine.optimizer.register_step_pre_hook(self._record(engine))

    @property
    def policy(self):
        return self.host.workers["policy"]

    @property
    def critic(self):
        return self.host.workers["critic"]

    def _record(self, engine):
        def hook(optimizer, args, kwargs) -> None:
            grads = {}
            for name, p in engine.model.named_parameters():
                g = p.grad if p.grad is not None else torch.zeros_like(p)
                grads[name] = (g.full_tensor() if hasattr(g, "full_tensor") else g).detach().clone()
            self.grads.append(grads)

        return hook

    def run(self, job: dict) -> list[dict[str, torch.Tensor]]:
        """One actor and one critic update on this rank's payloads; every optimiser step's gradients."""
        from rlctl.trainer.workers.losses import make_actor_loss, make_critic_loss

        mode, mbs = job["mode"], job["micro_batch"]
        self.policy.actor.micro_batch_size = mbs
        self.critic.critic.micro_batch_size = mbs
        loss = self.policy_spec.loss
        self.policy.actor_loss = make_actor_loss(replace(loss, actor=replace(loss.actor, loss_agg_mode=mode)))
        self.critic.critic_loss = make_critic_loss(replace(self.critic_spec, loss_agg_mode=mode))
        self.grads = []
        self.host.call("policy", "update_actor", *job["actor"])
        self.host.call("critic", "update_critic", *job["critic"])
        return self.grads


def _rank_main(rank: int, world: int, port: int, dirs: tuple[str, str], jobs, results) -> None:
    torch.set_num_threads(1)
    try:
        group = Group(rank, world, port, *dirs)
        results.put(("ready", rank, None))
        while (job := jobs[rank].get()) is not None:
            grads = group.run(job)
            results.put(("done", rank, grads if rank == 0 else None))
    except BaseException:  # report, then let the parent fail the test
        results.put(("error", rank, traceback.format_exc()))


class RankGroup:
    """A long-lived 2-rank gloo group that runs jobs sent from the test process."""

    def __init__(self, world: int, dirs: tuple[str, str]) -> None:
        from rlctl.dispatch.worker import free_port

        ctx = mp.get_context("spawn")
        self.world = world
        self.jobs = [ctx.Queue() for _ in range(world)]
        self.results = ctx.Queue()
        port = free_port()
        self.procs = [
            ctx.Process(target=_rank_main, args=(r, world, port, dirs, self.jobs, self.results), daemon=True)
            for r in range(world)
        ]
        for p in self.procs:
            p.start()
        self._collect("ready")

    def _collect(self, kind: str):
        out = None
        for _ in range(self.world):
            try:
                got, rank, value = self.results.get(timeout=180)
            except queue.Empty:
                raise AssertionError(f"rank group: no {kind!r} reply within 180 s") from None
            if got == "error":
                raise AssertionError(f"rank {rank} failed:\n{value}")
            if rank == 0:
                out = value
        return out

    def run(self, per_rank_jobs: list[dict]) -> list[dict[str, torch.Tensor]]:
        for r, job in enumerate(per_rank_jobs):
            self.jobs[r].put(job)
        return self._collect("done")

    def close(self) -> None:
        for q in self.jobs:
            q.put(None)
        for p in self.procs:
            p.join(timeout=30)
            if p.is_alive():
                p.terminate()


# ---- the driver side: batches, layout, dispatch, the whole-batch reference ------------------------


def make_step_batch(group_sizes: list[int], seed: int):
    """One step's batch in verl's convention, rows ordered by prompt group, with every column the
    actor and critic updates read; ``uid`` marks the groups."""
    from rlctl.dispatch import DataProto

    g = torch.Generator().manual_seed(seed)
    rows, prompt_len = sum(group_sizes), 5
    prompts = torch.randint(3, VOCAB, (rows, prompt_len), generator=g)
    responses = torch.randint(3, VOCAB, (rows, WIDTH), generator=g)
    prompt_mask = torch.ones(rows, prompt_len, dtype=torch.long)
    response_mask = torch.zeros(rows, WIDTH, dtype=torch.long)
    for i in range(rows):
        pl = int(torch.randint(1, prompt_len + 1, (1,), generator=g))
        rl = int(torch.randint(1, WIDTH + 1, (1,), generator=g))
        prompt_mask[i, : prompt_len - pl] = 0
        prompts[i, : prompt_len - pl] = PAD
        response_mask[i, :rl] = 1
        responses[i, rl:] = PAD
        if rl < WIDTH:
            responses[i, rl - 1] = EOS
    attention_mask = torch.cat([prompt_mask, response_mask], 1)
    uids = np.array([f"p{k}" for k, n in enumerate(group_sizes) for _ in range(n)], dtype=object)
    tensors = {
        "input_ids": torch.cat([prompts, responses], 1),
        "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
        "responses": responses,
        "response_mask": response_mask,
        # near the model's own log-probs (about -4) so that some ratios clip and some do not
        "old_log_probs": -4.0 + 0.3 * torch.randn(rows, WIDTH, generator=g),
        "ref_log_probs": -4.0 + 0.3 * torch.randn(rows, WIDTH, generator=g),
        "advantages": torch.randn(rows, WIDTH, generator=g),
        "values": 0.1 * torch.randn(rows, WIDTH, generator=g),
        "returns": torch.randn(rows, WIDTH, generator=g),
    }
    return DataProto.from_dict(tensors=tensors, non_tensors={"uid": uids}), uids


def payloads(batch, uids, mini_batch_prompts: int, world: int) -> list[tuple[tuple, dict]]:
    """What the driver sends each rank for one update call (layout, then the DP dispatch)."""
    from rlctl.dispatch import Dispatch, Execute, Mesh
    from rlctl.dispatch.modes import get_mode, plan_call
    from rlctl.trainer.step.minibatch import layout_mini_batches
    from rlctl.trainer.step.stages import for_workers

    laid = layout_mini_batches(for_workers(batch), uids, mini_batch_prompts, world)
    per_rank, _ = plan_call(
        get_mode(Dispatch.DP_COMPUTE_METRICS), Execute.ALL, Mesh.of(None, world), (laid,), {}
    )
    return [per_rank[r] for r in range(world)]


def jobs_for(batch, uids, job: dict, world: int) -> list[dict]:
    mbp = job["mini_batch_prompts"]
    actor = payloads(batch, uids, mbp, world)
    critic = payloads(batch, uids, mbp, world)
    return [dict(job, actor=actor[r], critic=critic[r]) for r in range(world)]


class Reference:
    """verl's formulas on each whole mini-batch, one plain process, plain HF modules (no engine)."""

    def __init__(self, actor_dir: str, critic_dir: str) -> None:
        from transformers import AutoModelForCausalLM

        from rlctl.engines.hf_model import load_value_model

        self.actor = AutoModelForCausalLM.from_pretrained(actor_dir)
        self.critic = load_value_model(critic_dir)

    @staticmethod
    def _grads(model, loss: torch.Tensor) -> dict[str, torch.Tensor]:
        model.zero_grad(set_to_none=True)
        loss.backward()
        return {n: p.grad.detach().clone() for n, p in model.named_parameters()}

    def actor_grads(self, mb: dict[str, torch.Tensor], mode: str) -> dict[str, torch.Tensor]:
        from rlctl.algorithms import (
            PolicyLossConfig,
            actor_loss,
            entropy_from_logits,
            entropy_loss,
            get_policy_loss,
            kl_loss,
        )

        r = mb["responses"].shape[1]
        logits = (
            self.actor(
                input_ids=mb["input_ids"],
                attention_mask=mb["attention_mask"],
                position_ids=mb["position_ids"],
            ).logits[:, -r - 1 : -1]
            / TEMPERATURE
        )
        logp = torch.log_softmax(logits.float(), -1).gather(-1, mb["responses"][..., None]).squeeze(-1)
        entropy = entropy_from_logits(logits.float())
        mask = mb["response_mask"]
        cfg = PolicyLossConfig(
            clip_ratio_low=0.2, clip_ratio_high=0.28, loss_agg_mode=mode, norm_constant=WIDTH
        )
        pg, _ = get_policy_loss("vanilla")(mb["old_log_probs"], logp, mb["advantages"], mask, mode, cfg)
        ent = entropy_loss(entropy, mask, mode, norm_constant=WIDTH)
        kl, _ = kl_loss(logp, mb["ref_log_probs"], mask, "low_var_kl", mode, norm_constant=WIDTH)
        return self._grads(self.actor, actor_loss(pg, ent, 0.01, kl, 0.1))

    def critic_grads(self, mb: dict[str, torch.Tensor], mode: str) -> dict[str, torch.Tensor]:
        from rlctl.algorithms import value_loss

        r = mb["responses"].shape[1]
        vpreds = self.critic(
            input_ids=mb["input_ids"], attention_mask=mb["attention_mask"], position_ids=mb["position_ids"]
        )[:, -r - 1 : -1]
        loss, _ = value_loss(
            vpreds, mb["returns"], mb["values"], mb["response_mask"], 0.2, mode, norm_constant=WIDTH
        )
        return self._grads(self.critic, loss)

    def steps(self, batch, uids, job: dict) -> list[dict[str, torch.Tensor]]:
        """Expected gradients of every optimiser step: the actor's mini-batches, then the critic's."""
        from rlctl.trainer.step.minibatch import cut_mini_batches

        cuts = cut_mini_batches(uids, len(batch), job["mini_batch_prompts"])
        minis = [{k: v[list(rows)] for k, v in batch.batch.items()} for rows in cuts]
        return [self.actor_grads(m, job["mode"]) for m in minis] + [
            self.critic_grads(m, job["mode"]) for m in minis
        ]


def relative_error(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> float:
    assert got.keys() == want.keys()
    diff = torch.cat([(got[k] - want[k]).flatten() for k in want]).norm()
    return float(diff / torch.cat([w.flatten() for w in want.values()]).norm().clamp(min=1e-30))


# ---- fixtures and tests ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dirs(tmp_path_factory) -> tuple[str, str]:
    from rlctl.engines.hf_model import load_value_model

    base = tmp_path_factory.mktemp("invariance")
    actor = make_model(base / "actor", seed=5)
    critic = Path(shutil.copytree(actor, base / "critic"))
    torch.manual_seed(11)
    head = load_value_model(critic).value_head
    with torch.no_grad():
        head.weight.normal_(0, 0.5)
    torch.save(head.state_dict(), critic / "value_head.pt")  # every load gets this head
    return str(actor), str(critic)


@pytest.fixture(scope="module")
def worlds(dirs):
    """World 1 in this process (the in-process path) and a 2-rank gloo group, plus the reference."""
    threads = torch.get_num_threads()
    two = RankGroup(2, dirs)
    try:
        one = Group(0, 1, 0, *dirs)
        torch.set_num_threads(threads)
        yield {1: one, 2: two}, Reference(*dirs)
    finally:
        two.close()


def check(worlds, group_sizes: list[int], seed: int, mode: str, micro_batch: int, mini_batch_prompts: int):
    groups, reference = worlds
    batch, uids = make_step_batch(group_sizes, seed)
    job = {"mode": mode, "micro_batch": micro_batch, "mini_batch_prompts": mini_batch_prompts}
    want = reference.steps(batch, uids, job)
    one = groups[1].run(jobs_for(batch, uids, job, 1)[0])
    two = groups[2].run(jobs_for(batch, uids, job, 2))
    assert len(one) == len(two) == len(want), (len(one), len(two), len(want))
    for i, w in enumerate(want):
        role = "actor" if i < len(want) // 2 else "critic"
        assert relative_error(one[i], w) <= TOL, (role, i, "world 1 vs reference")
        assert relative_error(two[i], w) <= TOL, (role, i, "world 2 vs reference")
        assert relative_error(two[i], one[i]) <= TOL, (role, i, "world 2 vs world 1")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_seven_rows_on_two_ranks_give_the_gradients_of_one_rank(worlds, mode):
    """The issue's case: 7 rows over 2 ranks used to train rank 1 on a second copy of row 0."""
    check(worlds, [2, 2, 3], seed=7, mode=mode, micro_batch=4, mini_batch_prompts=0)


@pytest.mark.timeout(300)
@settings(max_examples=20, deadline=None)
@given(
    group_sizes=st.lists(st.integers(1, 3), min_size=1, max_size=5),
    seed=st.integers(0, 2**16),
    mode=st.sampled_from(LOSS_AGG_MODES),
    micro_batch=st.integers(1, 8),
    mini_batch_prompts=st.integers(0, 3),
)
@example(group_sizes=[3] * 4, seed=1, mode="seq-mean-token-mean", micro_batch=1, mini_batch_prompts=1)
def test_update_is_the_same_on_one_and_two_ranks(
    worlds, group_sizes, seed, mode, micro_batch, mini_batch_prompts
):
    check(worlds, group_sizes, seed, mode, micro_batch, mini_batch_prompts)
