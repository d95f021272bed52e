"""Field declarations for profile sections: default, help text and the allowed range.

Every profile key is declared once, with its constraint next to it, so validation, `profile show`
and the README's profile reference all read the same source.
"""

from __future__ import annotations

import dataclasses
from typing import Any


def field(
    default: Any,
    help: str,
    *,
    gt: float | None = None,
    ge: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    choices: tuple[Any, ...] | None = None,
    path: bool = False,
) -> Any:
    """A dataclass field with validation metadata.

    ``path=True`` marks a file-system path that is resolved relative to the profile file that
    sets it (so ``extends`` chains keep working from any directory).
    """
    meta = {"help": help, "gt": gt, "ge": ge, "le": le, "lt": lt, "choices": choices, "path": path}
    if isinstance(default, list):
        return dataclasses.field(default_factory=lambda: list(default), metadata=meta)
    if isinstance(default, dict):
        return dataclasses.field(default_factory=lambda: dict(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def describe_range(meta: dict[str, Any]) -> str:
    """Human description of a field's constraint, e.g. '> 0' or 'one of a, b'."""
    if meta.get("choices"):
        return "one of " + ", ".join(repr(c) for c in meta["choices"])
    parts = []
    for key, sym in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<=")):
        if meta.get(key) is not None:
            parts.append(f"{sym} {meta[key]:g}")
    return " and ".join(parts)


def check_range(value: Any, meta: dict[str, Any]) -> bool:
    """Whether ``value`` satisfies the field's constraint."""
    if meta.get("choices") and value not in meta["choices"]:
        return False
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return True
    checks = (
        ("gt", lambda v, b: v > b),
        ("ge", lambda v, b: v >= b),
        ("lt", lambda v, b: v < b),
        ("le", lambda v, b: v <= b),
    )
    return all(meta.get(k) is None or ok(value, meta[k]) for k, ok in checks)
