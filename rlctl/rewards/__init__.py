"""Rewards: rule verifiers, math-verify, custom functions, a reward model, sandboxed code execution."""

from rlctl.rewards.custom import load_custom_reward
from rlctl.rewards.manager import KINDS, RewardManager, RewardOutput, build_reward_manager
from rlctl.rewards.verifiers import VERIFIERS, builtin_score, exact_match, math_match, numeric_match

__all__ = [
    "KINDS",
    "VERIFIERS",
    "RewardManager",
    "RewardOutput",
    "build_reward_manager",
    "builtin_score",
    "exact_match",
    "load_custom_reward",
    "math_match",
    "numeric_match",
]
