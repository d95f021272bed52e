"""The driver's typed handle on each colocated role: the worker methods it calls, declared.

``ctx.policy.sync_weights(step, skip)`` on the driver resolves here to
``PolicyWorker.sync_weights`` (its parameters and return type), for a reader and an editor alike;
a worker method renamed without its handle fails at import, and ``tests/trainer/test_handles.py``
checks each handle declares exactly its worker's ``@register`` methods. The off-policy rollout
workers' handle is :class:`rlctl.trainer.workers.rollout.RolloutGroup`, beside its worker.
"""

from __future__ import annotations

from rlctl.dispatch import WorkerGroup, remote
from rlctl.trainer.workers.roles import CriticWorker, PolicyWorker, ReferenceWorker


class PolicyGroup(WorkerGroup):
    """The policy: the actor's training engine and its colocated rollout engine on every rank."""

    init_model = remote(PolicyWorker.init_model)
    generate_sequences = remote(PolicyWorker.generate_sequences)
    generate_episodes = remote(PolicyWorker.generate_episodes)
    compute_log_prob = remote(PolicyWorker.compute_log_prob)
    compute_ref_log_prob = remote(PolicyWorker.compute_ref_log_prob)  # a LoRA actor's own reference
    update_actor = remote(PolicyWorker.update_actor)
    rollout_log_prob_gap = remote(PolicyWorker.rollout_log_prob_gap)
    sync_weights = remote(PolicyWorker.sync_weights)
    full_weights = remote(PolicyWorker.full_weights)
    published_full = remote(PolicyWorker.published_full)
    save_checkpoint = remote(PolicyWorker.save_checkpoint)
    load_checkpoint = remote(PolicyWorker.load_checkpoint)
    export_hf = remote(PolicyWorker.export_hf)
    peak_memory = remote(PolicyWorker.peak_memory)


class ReferenceGroup(WorkerGroup):
    """The frozen reference policy."""

    init_model = remote(ReferenceWorker.init_model)
    compute_ref_log_prob = remote(ReferenceWorker.compute_ref_log_prob)
    peak_memory = remote(ReferenceWorker.peak_memory)


class CriticGroup(WorkerGroup):
    """PPO's value model."""

    init_model = remote(CriticWorker.init_model)
    compute_values = remote(CriticWorker.compute_values)
    update_critic = remote(CriticWorker.update_critic)
    save_checkpoint = remote(CriticWorker.save_checkpoint)
    load_checkpoint = remote(CriticWorker.load_checkpoint)
    peak_memory = remote(CriticWorker.peak_memory)


HANDLES: dict[str, type[WorkerGroup]] = {"policy": PolicyGroup, "ref": ReferenceGroup, "critic": CriticGroup}
