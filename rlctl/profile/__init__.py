"""Profiles: TOML files resolved into a typed, validated ``Profile``."""

from rlctl.profile.dump import profile_to_dict, profile_to_toml
from rlctl.profile.loader import load_profile
from rlctl.profile.schema import Profile

__all__ = ["Profile", "load_profile", "profile_to_dict", "profile_to_toml"]
