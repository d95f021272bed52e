"""The profile reference (docs/profiles.md), generated from the schema so it cannot drift."""

from __future__ import annotations

import dataclasses

from rlctl.profile.fields import describe_range
from rlctl.profile.schema import SECTIONS


def reference_markdown() -> str:
    """One table per section: key, default, allowed values, meaning."""
    lines = [
        "# Profile reference",
        "",
        "Generated from `rlctl/profile/schema.py` (`rlctl profile keys` prints the same).",
        "Every key has a default; a profile states only what differs.",
        "",
    ]
    for name, cls in SECTIONS.items():
        inst = cls()
        lines += [f"## [{name}]", "", "| key | default | allowed | meaning |", "|---|---|---|---|"]
        for f in dataclasses.fields(cls):
            allowed = describe_range(dict(f.metadata)).replace("|", "\\\\|")
            default = repr(getattr(inst, f.name)).replace("'", '"')
            lines.append(f"| `{f.name}` | `{default}` | {allowed} | {f.metadata['help']} |")
        lines.append("")
    return "\n".join(lines)
