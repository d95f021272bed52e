"""How a LoRA actor's (``[actor.lora]``) weights reach the platform's default rollout engine."""

from __future__ import annotations

import importlib.util

from rlctl.platforms import Platform
from rlctl.verdict import Check, passed, skipped, warned


def check_lora_sync(p: Platform, torch_imports: bool = True) -> Check:
    """Adapter-only sync where the engine holds the base plus an adapter it updates in place (HF);
    merged-weight sync (the full model's bytes every step) where rlctl has no adapter path for it.
    The engine modules import torch in this process: not tried when ``import torch`` fails (the
    torch-import row says why; a half-imported torch can crash the process at exit)."""
    from rlctl.engines.registry import get_engine

    name = "lora sync"
    if importlib.util.find_spec("peft") is None:
        return skipped(name, "peft not installed: [actor.lora] unavailable (pip install 'rlctl[lora]')", "lora")
    engine = p.rollout_engine()
    if engine is None:
        return skipped(name, "no rollout engine installed", "lora")
    if not torch_imports:
        return skipped(name, "import torch fails here (see torch-import): no engine to ask", "lora")
    cls = get_engine("rollout", "*", engine, p.device_type, p.name)
    if getattr(cls, "adapter_sync", False):
        how = (
            "base held once, adapter tensors copied in place"
            if getattr(cls, "shares_trainer_base", False)
            else "base loaded by the engine once, each sync a new adapter through its LoRA API"
        )
        return passed(name, f"{engine}: adapter-only sync ({how})", "lora")
    gap_of = getattr(cls, "adapter_sync_gap", None)
    gap = gap_of() if gap_of is not None else None
    why = f"adapter-only sync unavailable: {gap}" if gap else "its own LoRA API is not used by rlctl yet"
    return warned(
        name,
        f"{engine}: merged-weight sync (base + adapter merged on the trainer, the full model's bytes per step); {why}",
        "rollout.engine = 'hf' syncs the adapter alone",
        "lora",
    )
