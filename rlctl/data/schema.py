"""verl's row schema, checked row by row so a bad row is reported by file, row and field.

A row: ``prompt`` (non-empty list of ``{"role", "content"}`` chat messages), ``data_source``
(string), ``reward_model`` (``{"ground_truth": ..., "style": ...}``; style defaults to "rule")
and ``extra_info`` (dict, optional). Other columns are kept as they are.
"""

from __future__ import annotations

from typing import Any

from rlctl.errors import UserError

ROLES = ("system", "user", "assistant")


def _bad(where: str, field: str, expected: str, got: Any) -> UserError:
    shown = repr(got)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return UserError(f"{where}: field {field!r}: expected {expected}, got {shown}")


def validate_row(row: Any, where: str) -> dict[str, Any]:
    """The row normalised (extra_info dict, style set), or a UserError naming ``where`` and the field."""
    if not isinstance(row, dict):
        raise UserError(f"{where}: expected an object with prompt/data_source/reward_model, got {row!r:.60}")
    prompt = row.get("prompt")
    if not isinstance(prompt, list) or not prompt:
        raise _bad(where, "prompt", "a non-empty list of {role, content} chat messages", prompt)
    for i, msg in enumerate(prompt):
        if not isinstance(msg, dict):
            raise _bad(where, f"prompt[{i}]", "a {role, content} object", msg)
        if msg.get("role") not in ROLES:
            raise _bad(where, f"prompt[{i}].role", f"one of {', '.join(ROLES)}", msg.get("role"))
        if not isinstance(msg.get("content"), str):
            raise _bad(where, f"prompt[{i}].content", "a string", msg.get("content"))
    if not isinstance(row.get("data_source"), str) or not row["data_source"]:
        raise _bad(where, "data_source", "a non-empty string", row.get("data_source"))
    rm = row.get("reward_model")
    if not isinstance(rm, dict):
        raise _bad(where, "reward_model", "an object with ground_truth", rm)
    if rm.get("ground_truth") is None:
        raise _bad(where, "reward_model.ground_truth", "a value (string, number or object)", None)
    extra = row.get("extra_info")
    if extra is None:
        extra = {}
    if not isinstance(extra, dict):
        raise _bad(where, "extra_info", "an object (or absent)", extra)
    out = dict(row)
    out["prompt"] = [{"role": m["role"], "content": m["content"]} for m in prompt]
    out["reward_model"] = {**rm, "style": rm.get("style") or "rule"}
    out["extra_info"] = extra
    return out
