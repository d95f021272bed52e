"""Doctor checks for the code-reward sandbox: one row per protection layer this host gives or lacks.

PASS: the layer is active. WARN: it is missing, so ``reward.kind = "code"`` refuses to run at
``reward.sandbox = "strict"`` (required layers) or runs with less (the process limit).
FAIL: no interpreter starts in the sandbox, so code rewards cannot run at any level.
"""

from __future__ import annotations

from rlctl.verdict import Check, failed, passed, warned


def check_sandbox() -> list[Check]:
    """Probe the sandbox (a few trivial snippets, cached per process) and report each layer.

    Imported here, not at module level: ``rlctl.rewards`` imports torch, and doctor must still
    report (not crash) when ``import torch`` is what is broken.
    """
    try:
        from rlctl.rewards.sandbox import sandbox_plan
        from rlctl.rewards.sandbox_layers import HOW_TO_GET, REQUIRED
    except Exception as exc:
        return [
            failed(
                "sandbox",
                f"cannot load the code-reward sandbox checks: {type(exc).__name__}: {exc}"[:300],
                "fix the failure above (see the torch and torch-import rows)",
                "sandbox",
            )
        ]

    plan = sandbox_plan()
    if plan.python is None:
        why = plan.missing_why.get("interpreter", "")
        return [
            failed(
                "sandbox",
                f"no Python interpreter starts in the code-reward sandbox ({why})",
                "install python3 (/usr/bin/python3) readable by all users, or run rlctl as root",
                "sandbox",
            )
        ]
    rows = []
    for layer in plan.layers():
        name = f"sandbox:{layer.name}"
        if layer.active:
            rows.append(passed(name, layer.detail, "sandbox"))
        elif layer.name in REQUIRED:
            reason = f"missing ({layer.detail}): code rewards refuse to run at reward.sandbox = 'strict'"
            fix = f"{HOW_TO_GET[layer.name]}, or set reward.sandbox = 'best-effort'"
            rows.append(warned(name, reason, fix, "sandbox"))
        else:
            rows.append(warned(name, f"missing: {layer.detail}", HOW_TO_GET.get(layer.name, ""), "sandbox"))
    return rows
