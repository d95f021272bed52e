"""The profile reference (docs/profiles.md), generated from the schema so it cannot drift."""

from __future__ import annotations

import dataclasses
import typing

from rlctl.profile.fields import describe_range
from rlctl.profile.loader import nested_table
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
        lines += _table(name, cls)
    return "\n".join(lines)


def _table(name: str, cls: type) -> list[str]:
    """One section's table, then one per sub-table (``[actor.lora]``)."""
    inst = cls()
    hints = typing.get_type_hints(cls)
    lines = [f"## [{name}]", "", "| key | default | allowed | meaning |", "|---|---|---|---|"]
    subs = []
    for f in dataclasses.fields(cls):
        allowed = describe_range(dict(f.metadata)).replace("|", "\\\\|")
        default = repr(getattr(inst, f.name)).replace("'", '"')
        lines.append(f"| `{f.name}` | `{default}` | {allowed} | {f.metadata['help']} |")
        sub = nested_table(hints[f.name])
        if sub is not None:
            subs.append((f"{name}.{f.name}", sub))
    lines.append("")
    for sub_name, sub in subs:
        lines += _table(sub_name, sub)
    return lines
