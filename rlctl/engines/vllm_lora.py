"""Adapter-only LoRA sync into vLLM through its own LoRA API (``LoRARequest`` + ``add_lora``).

Read from the released wheels (0.10.2, 0.13.0, 0.23.0, 0.33.0; surfaces in
``tests/engines/surfaces/vllm-*.json``). Not yet run on NVIDIA hardware.

- ``LoRARequest(lora_name, lora_int_id, lora_path)`` (``vllm/lora/request.py``, a msgspec struct;
  ``lora_int_id`` must be >= 1 and unique per adapter) names an adapter *directory*: the worker's
  ``_load_adapter`` (``vllm/lora/worker_manager.py``) reads ``adapter_config.json`` with
  ``PEFTHelper.from_local_dir`` and the tensors from ``adapter_model.safetensors``
  (``LoRAModel.from_local_checkpoint``, ``vllm/lora/models.py`` 0.10.2, ``lora_model.py`` 0.13+),
  whose keys are peft's saved names. No released version takes tensors in memory through a public
  API (verl's ``TensorLoRARequest`` patches the worker manager's private ``_load_adapter``); rlctl
  writes a peft adapter directory per version instead, in shared memory (``/dev/shm``) where there is one.
- ``LLM.llm_engine.add_lora(request)`` / ``remove_lora(id)`` / ``list_loras()``
  (``vllm/v1/engine/llm_engine.py``, every recorded version) load and drop it on the workers;
  ``LLM.generate(..., lora_request=)`` samples with it. Each sync is a new id (the weight version),
  the previous one is removed first, so one adapter is held (``max_loras=1``).
- ``EngineArgs(enable_lora=True, max_lora_rank=R, max_loras=1)``: ``max_lora_rank`` must be one of
  8, 16, 32, 64, 128, 256, 320, 512 (0.10.2 ``config/lora.py`` ``possible_max_ranks``; 0.13+
  ``MaxLoRARanks`` adds 1), so the smallest one >= the adapter's rank is asked for.
- ``modules_to_save`` is refused by vLLM's ``PEFTHelper._validate_features`` (0.33.0: only
  ``classifier`` / ``score``): those trained copies are loaded into the base model in place
  (``load_weights`` under the module's own name) and left out of ``adapter_config.json``.
- The adapter tensors vLLM holds are in its private LoRA manager (B may be pre-scaled), so the
  weight fingerprint reports them "not available"; the canary (prompt log-probs with the request)
  checks what vLLM computes with.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

from rlctl.engines.adapter_dir import AdapterDirs
from rlctl.engines.external_version import init_fields, installed_version
from rlctl.engines.lora import LoraSpec
from rlctl.errors import RunError

RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vllm/config/lora.py MaxLoRARanks (0.13+); 1 not in 0.10.2
ENGINE_METHODS = ("add_lora", "remove_lora", "list_loras")


def max_lora_rank(rank: int, version: tuple[int, ...]) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that holds an adapter of ``rank``."""
    allowed = [r for r in RANKS if r >= rank and (r != 1 or version >= (0, 13))]
    if not allowed:
        raise ValueError(f"LoRA rank {rank} exceeds vLLM's largest max_lora_rank {RANKS[-1]}")
    return allowed[0]


def adapter_api_gap(vllm: Any, engine_fields: set[str]) -> str | None:
    """None when this vLLM has what adapter-only sync uses; else what it lacks."""
    if not {"enable_lora", "max_lora_rank", "max_loras"} <= engine_fields:
        return "EngineArgs has no enable_lora / max_lora_rank / max_loras"
    try:
        from vllm.lora.request import LoRARequest  # noqa: F401
        from vllm.v1.engine.llm_engine import LLMEngine
    except ImportError as exc:
        return f"no {exc.name}"
    missing = [m for m in ENGINE_METHODS if not hasattr(LLMEngine, m)]
    return f"LLMEngine lacks {', '.join(missing)}" if missing else None


def installed_adapter_gap() -> str | None:
    """None when the installed vLLM takes adapter-only LoRA sync; else why it does not."""
    try:
        vllm = importlib.import_module("vllm")
    except ImportError:
        return "vllm not installed"
    gap = adapter_api_gap(vllm, init_fields(vllm.EngineArgs))
    return None if gap is None else f"vllm {installed_version('vllm')}: {gap}"


class AdapterSyncFlag:
    """``VLLMRolloutEngine.adapter_sync``: on the class, whether the installed vLLM has the LoRA API
    adapter-only sync uses; on an engine, whether it was built with ``lora`` (each sync then sends
    the adapter alone)."""

    def __get__(self, obj, cls) -> bool:
        if obj is not None:
            return obj.lora is not None
        return installed_adapter_gap() is None


class AdapterPublisher:
    """Writes each synced adapter as a peft directory and swaps it into vLLM (one held)."""

    def __init__(self, llm: Any, spec: LoraSpec, model_path: str):
        from vllm.lora.request import LoRARequest

        self._request_type = LoRARequest
        self.llm = llm
        self.dirs = AdapterDirs(spec, model_path, "rlctl-vllm-lora-")
        self.request: Any = None

    def publish(self, tensors: dict[str, torch.Tensor]) -> Any:
        """``tensors``: trainer-named LoRA tensors. Returns the new ``LoRARequest``."""
        version, where = self.dirs.write(tensors)
        engine = self.llm.llm_engine
        previous = self.request
        if previous is not None:  # drop the old one first: one adapter held at a time
            engine.remove_lora(previous.lora_int_id)
            self.dirs.drop(previous.lora_path)
        request = self._request_type(lora_name=f"rlctl-v{version}", lora_int_id=version, lora_path=str(where))
        if not engine.add_lora(request):
            raise RunError(f"vLLM add_lora refused the adapter of weight version {version} ({where})")
        held = set(engine.list_loras())
        if held != {version}:
            raise RunError(f"vLLM holds LoRA ids {sorted(held)} after sync {version}, expected only it")
        self.request = request
        return request
