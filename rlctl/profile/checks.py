"""Cross-field checks that one key's validation alone cannot see."""

from __future__ import annotations

from pathlib import Path

from rlctl.errors import UserError
from rlctl.profile.schema import Profile


def check_profile(profile: Profile, origins: dict[str, Path]) -> None:
    """Raise UserError for the first inconsistency, naming the file and key that set it."""

    def fail(key: str, message: str) -> None:
        raise UserError(f"{origins.get(key, profile.source)}: {key}: {message}")

    if not profile.model.path:
        fail("model.path", "required: a local HF model directory")
    mini = profile.actor.mini_batch_prompts
    if mini and profile.trainer.prompts_per_step % mini:
        fail(
            "actor.mini_batch_prompts",
            f"expected a divisor of trainer.prompts_per_step ({profile.trainer.prompts_per_step}), got {mini}",
        )
    reward = profile.reward
    if reward.kind == "custom" and ":" not in reward.function:
        fail("reward.function", f"expected 'path/to/file.py:function_name', got {reward.function!r}")
    if reward.kind != "custom" and reward.function:
        fail("reward.function", f"set, but reward.kind is {reward.kind!r} (use kind = 'custom')")
    if reward.kind == "reward_model" and not reward.model_path:
        fail("reward.model_path", "required when reward.kind = 'reward_model'")
    if profile.algorithm.adv_estimator == "remax" and profile.rollout.n < 1:
        fail("rollout.n", "remax needs at least one sample per prompt")
    for name in profile.trainer.loggers:
        if name not in ("console", "jsonl", "tensorboard", "wandb"):
            fail("trainer.loggers", f"expected console, jsonl, tensorboard or wandb, got {name!r}")
