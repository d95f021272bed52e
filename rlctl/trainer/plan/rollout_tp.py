"""The rollout's tensor-parallel layout over the policy's ranks, as the plan and the specs read it.

The planner (:mod:`rlctl.reshard`) imports torch, so it is imported only where a profile asks for
rollout tensor parallelism: ``rlctl doctor`` and ``rlctl plan`` otherwise run without torch in
process (a broken vendor plugin of torch must not stop them)."""

from __future__ import annotations

from rlctl.profile.schema import Profile
from rlctl.trainer.plan.shape import model_config


def rollout_rank_order(profile: Profile) -> tuple[str, str]:
    """The rollout TP groups' order over the policy's ranks, and why
    (:func:`rlctl.reshard.choose_rank_order` on the model's config)."""
    c, tp = profile.cluster, profile.rollout.tensor_parallel
    if tp == 1:
        return "contiguous", "rollout tensor-parallel 1"
    if profile.rollout.engine in ("vllm", "sglang"):
        return "contiguous", f"{profile.rollout.engine} cuts contiguous TP groups out of the trainer's ranks"
    config = model_config(profile.model.path)
    if config is None:
        return "contiguous", "the model's config is not readable here: contiguous TP groups"
    from rlctl.reshard import choose_rank_order

    return choose_rank_order(config, c.nodes * c.devices_per_node, tp, c.devices_per_node)


def moved_per_rank(profile: Profile, world: int, tp: int, dtype: str) -> int | None:
    """Bytes one rank receives from others per sync at rollout TP ``tp`` (the planner's count over
    all ranks, averaged), or None when the model's config is not readable here."""
    config = model_config(profile.model.path)
    if config is None or world % tp:
        return None
    from rlctl.engines.hf_model import resolve_dtype
    from rlctl.reshard import train_to_rollout_plan

    order = rollout_rank_order(profile)[0]
    fmt = {"vllm": "vllm", "sglang": "hf"}.get(profile.rollout.engine, "hf_tp")
    tp = 1 if fmt == "hf" else tp  # SGLang's TP ranks each take full tensors
    plan = train_to_rollout_plan(config, world, tp, rank_order=order, fmt=fmt, dtype=resolve_dtype(dtype))
    return plan.bytes_moved() // world
