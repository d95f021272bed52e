"""Building a policy's rollout engine from its spec (the registry's class for the model and device)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rlctl.engines import lora as lora_lib
from rlctl.engines.fsdp_load import build_meta_model
from rlctl.engines.hf_model import resolve_dtype
from rlctl.engines.registry import get_engine


def _model_type(path: str) -> str:
    try:
        return json.loads((Path(path) / "config.json").read_text())["model_type"]
    except (OSError, KeyError, ValueError):
        return "*"


def needs_node_devices(spec: Any) -> bool:
    """Whether the rollout engine a policy spec names must see its node's devices from each rank:
    an engine that drives a whole tensor-parallel replica from one rank (SGLang at TP > 1, its
    ``node_devices_at_tp``). The worker pool then asks Ray not to narrow visibility."""
    r = spec.rollout
    if r.tensor_parallel_size <= 1:
        return False
    cls = get_engine("rollout", _model_type(spec.engine.model_path), r.engine, spec.engine.device_type, r.vendor)
    return bool(getattr(cls, "node_devices_at_tp", False))


def rollout_engine(spec: Any, actor: Any = None) -> Any:
    """The rollout engine a policy spec names (engine registry), loaded from the spec's model.

    A colocated LoRA actor (``actor``, unsharded, same dtype) lends an adapter-holding engine its
    frozen base tensors instead of a second copy (:func:`rlctl.engines.lora.shared_base_model`)."""
    r = spec.rollout
    cls = get_engine("rollout", _model_type(spec.engine.model_path), r.engine, spec.engine.device_type, r.vendor)
    # an engine that holds base + adapter gets the adapter layers; others take merged weights
    lora = getattr(spec, "lora", None)
    extra = {"lora": lora} if lora is not None and getattr(cls, "adapter_sync", False) else {}
    source = spec.engine.model_path
    shares = getattr(cls, "shares_trainer_base", False)  # vLLM / SGLang load their base themselves
    if extra and shares and actor is not None and lora_lib.can_share_base(actor.model, resolve_dtype(r.dtype)):
        meta = build_meta_model(
            source,
            dtype=spec.rollout.dtype,
            trust_remote_code=spec.engine.trust_remote_code,
            attn_implementation=spec.engine.attn_implementation,
            value_head=False,
        )
        source, extra = lora_lib.shared_base_model(actor.model, lora_lib.inject(meta, lora, on_meta=True)), {}
    if r.tensor_parallel_size > 1:  # only engines that split themselves take the TP layout
        extra["rank_order"] = r.rank_order
    return cls(
        source,
        device=spec.engine.device_type,
        dtype=r.dtype,
        trust_remote_code=spec.engine.trust_remote_code,
        tensor_parallel_size=r.tensor_parallel_size,
        gpu_memory_utilization=r.gpu_memory_utilization,
        seed=spec.engine.seed,
        **r.engine_kwargs,  # the platform's settings for this engine (the HF engine: attn_implementation)
        **extra,
    )
