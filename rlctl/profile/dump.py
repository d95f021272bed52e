"""Profile -> plain dict / TOML text (for `rlctl profile show` and run directories)."""

from __future__ import annotations

import dataclasses
from typing import Any

import tomli_w

from rlctl.profile.schema import SECTIONS, Profile


def profile_to_dict(profile: Profile) -> dict[str, Any]:
    """Every key of every section, resolved (defaults included)."""
    out: dict[str, Any] = {"description": profile.description}
    for name in SECTIONS:
        # an absent sub-table (``actor.lora`` off) is None, which TOML cannot write: leave it out
        out[name] = {k: v for k, v in dataclasses.asdict(getattr(profile, name)).items() if v is not None}
    return out


def profile_to_toml(profile: Profile) -> str:
    """The fully resolved profile as TOML text that loads back to the same Profile."""
    return tomli_w.dumps(profile_to_dict(profile))
