"""Everything a run needs, built once from the Profile: platform, tokenizer, data, reward, workers."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch

from rlctl.dispatch import DataProto, spawn_colocated
from rlctl.dispatch.mesh import Mesh
from rlctl.dispatch.pool import ResourcePool
from rlctl.errors import UserError
from rlctl.log import get_logger
from rlctl.profile.schema import Profile
from rlctl.trainer.plan.run_plan import RunPlan
from rlctl.trainer.setup.evaluate import scorer_for
from rlctl.trainer.setup.models import load_tokenizer, stop_token_ids
from rlctl.trainer.setup.prompts import PromptSource, load_prompts
from rlctl.trainer.step.scoring import BatchScorer
from rlctl.trainer.workers.handles import HANDLES, CriticGroup, PolicyGroup, ReferenceGroup
from rlctl.trainer.workers.roles import CriticWorker, PolicyWorker, ReferenceWorker
from rlctl.trainer.workers.rollout_engines import needs_node_devices

log = get_logger("rlctl.setup")


@dataclass
class RunContext:
    profile: Profile
    run_dir: Path
    platform: Any
    tokenizer: Any
    train_data: PromptSource
    val_prompts: DataProto | None
    reward: BatchScorer
    policy: PolicyGroup
    ref: ReferenceGroup | PolicyGroup | None  # a LoRA policy is its own reference (adapter off)
    critic: CriticGroup | None
    stop_ids: list[int]  # every token that ends a response (see models.stop_token_ids)
    pool: ResourcePool | None = None  # the groups' placement groups, released at shutdown
    plan: RunPlan | None = None  # what the workers were built from (RUN_DIR/plan.json)
    driver_threads: int | None = None  # the driver's torch threads before the run (restored at shutdown)

    def sampling(self, validation: bool = False) -> dict[str, Any]:
        """Sampling parameters sent with each generation request (validation: val_temperature)."""
        r = self.profile.rollout
        temperature = r.val_temperature if validation else r.temperature
        return {
            "temperature": temperature or 1.0,
            "top_p": 1.0 if validation else r.top_p,
            "top_k": 0 if validation else r.top_k,
            "max_new_tokens": r.max_new_tokens,
            "greedy": validation and r.val_temperature == 0,
            "eos_token_id": self.stop_ids,
            "pad_token_id": self.tokenizer.pad_token_id
            if self.tokenizer.pad_token_id is not None
            else self.tokenizer.eos_token_id,
        }

    def shutdown(self) -> None:
        for group in (self.policy, self.ref, self.critic):
            if group is not None and (group is not self.ref or self.ref is not self.policy):
                group.shutdown()
        if self.pool is not None:  # else every run in one process keeps its placement group
            self.pool.release()
        if self.driver_threads is not None:
            torch.set_num_threads(self.driver_threads)


def quiet_driver_threads(backend: str) -> int | None:
    """With the workers in processes of their own (``cluster.backend = "ray"``) the driver's torch
    runs on one thread, and the count it had is returned (None: in-process, nothing changed).

    The driver's tensors are a step's scores, masks and advantages; its idle OpenMP threads spin
    after each of its ops on cores the workers' threads are waiting for (on a 2-core host the
    built-in model's 8 x 8 sync step went from 0.094 to 0.079 s).
    """
    if backend == "inprocess":
        return None
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    return threads


def _check_rollout_log_probs(profile: Profile, policy: PolicyGroup) -> None:
    """Rollout correction reweights by the rollout engine's log-probs: refuse to run on wrong ones."""
    algo, r = profile.algorithm, profile.rollout
    if algo.rollout_correction == "off":
        return
    gap = policy.rollout_log_prob_gap(r.temperature, r.top_p, r.top_k)
    if gap:
        raise UserError(
            f"{profile.source}: algorithm.rollout_correction: {algo.rollout_correction} needs the rollout "
            f"engine's log-probs under log_softmax(logits / T), but {gap}; set it to 'off' or change "
            "the sampling settings"
        )


def build_context(profile: Profile, run_dir: Path, plan: RunPlan) -> RunContext:
    """Load data and reward, spawn the colocated worker groups ``plan`` names, each worker built
    from its role plan's spec (the run's one resolution: nothing is resolved here)."""
    platform = plan.platform_object
    tokenizer = load_tokenizer(
        profile.model.tokenizer or profile.model.path,
        profile.model.trust_remote_code,
        where=f"{profile.source}: model.path",
    )
    train, val = load_prompts(profile, tokenizer)
    if profile.reward.kind == "verl":  # an unscorable data_source fails here, before any worker starts
        from rlctl.rewards.verl import check_sources

        check_sources(train.batcher.dataset.data_sources())
    scorer = scorer_for(profile, tokenizer)
    if profile.agent.openai_agent:  # the agent, its client and the template's splice, before workers
        from rlctl.agents.preflight import check_openai_agent

        base_dir = Path(profile.source).resolve().parent if profile.source else Path.cwd()
        check_openai_agent(
            profile.agent.openai_agent, base_dir, tokenizer, f"{profile.source}: agent.openai_agent"
        )
    policy = plan.policy.spec  # each worker gets its role's spec from the plan (RUN_DIR/plan.json)
    dtype, attn, engine = plan.dtype, policy.engine.attn_implementation, policy.rollout.engine
    roles: dict[str, type] = {"policy": PolicyWorker}
    init: dict[str, dict] = {"policy": {"spec": policy}}
    for name, cls in (("ref", ReferenceWorker), ("critic", CriticWorker)):
        if name in plan.roles:
            roles[name], init[name] = cls, {"spec": plan.roles[name].spec}
    c = profile.cluster
    pool = ResourcePool(
        nodes=c.nodes,
        devices_per_node=c.devices_per_node,
        resource=plan.ray_resource,
        runtime=platform.runtime_spec(),
        node_devices=needs_node_devices(policy),
    )
    log.info(
        "starting workers",
        platform=platform.name,
        backend=c.backend,
        world=pool.world_size,
        roles=",".join(roles),
        dtype=dtype,
        attention=attn,
        rollout=engine,
    )
    groups = spawn_colocated(
        pool,
        roles,
        # generation runs over the rollout replicas (Mesh.rollout); every other stage over all ranks
        mesh=Mesh.of(None, pool.world_size).with_rollout(
            policy.rollout.tensor_parallel_size, policy.rollout.rank_order
        ),
        backend=c.backend,
        init_kwargs=init,
        handles={role: HANDLES[role] for role in roles},
        env=plan.env,
        address=c.address,
        default_timeout=c.call_timeout_s,
    )
    driver_threads = quiet_driver_threads(c.backend)
    try:
        for group in groups.values():
            group.init_model()
        _check_rollout_log_probs(profile, groups["policy"])
    except BaseException:
        for group in groups.values():
            group.shutdown()
        pool.release()
        if driver_threads is not None:
            torch.set_num_threads(driver_threads)
        raise
    return RunContext(
        profile=profile,
        run_dir=run_dir,
        platform=platform,
        tokenizer=tokenizer,
        train_data=train,
        val_prompts=val,
        reward=scorer,
        policy=cast(PolicyGroup, groups["policy"]),  # each group is its role's handle (HANDLES)
        # a LoRA actor serves its own reference (adapter off): no second model
        ref=cast(PolicyGroup, groups["policy"])
        if policy.serves_reference
        else cast(ReferenceGroup | None, groups.get("ref")),
        critic=cast(CriticGroup | None, groups.get("critic")),
        stop_ids=stop_token_ids(profile.model.path, tokenizer),
        pool=pool,
        plan=plan,
        driver_threads=driver_threads,
    )
