"""Adapter-only LoRA sync into SGLang through its own API (``Engine.load_lora_adapter``).

Read from the released wheels (0.5.3 and 0.5.23; surfaces in ``tests/engines/surfaces/sglang-*.json``).
Not yet run on NVIDIA hardware.

- ``Engine.load_lora_adapter(lora_name, lora_path, pinned=False)`` / ``unload_lora_adapter(lora_name)``
  (``sglang/srt/entrypoints/engine.py``, both versions) return a ``LoRAUpdateOutput`` with
  ``success`` and ``error_message`` (``sglang/srt/managers/io_struct.py`` 0.5.23); the adapter is a
  peft directory (:mod:`.adapter_dir`). ``Engine.generate(..., lora_path=[name per prompt])``
  samples with the adapter loaded under that name.
- ``ServerArgs(enable_lora=True, max_lora_rank=R, lora_target_modules=[...], max_loras_per_batch=1)``:
  with no ``lora_paths`` at start both the rank and the target modules must be given
  (``ServerArgs._handle_lora`` / ``check_lora_server_args``, 0.5.3 ``server_args.py``); ``"all"``
  stands for every supported projection (``LORA_TARGET_ALL_MODULES``), peft's ``all-linear``.
- 0.5.23 also has ``load_lora_adapter_from_tensors``; the directory path is kept for both versions.
- SGLang's adapter tensors are not readable through its API, as its base weights are not
  (:meth:`.sglang_rollout.SGLangRolloutEngine.weight_fingerprint`): the check reports "not available".
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

from rlctl.engines.adapter_dir import AdapterDirs
from rlctl.engines.external_version import accepts, init_fields, installed_version
from rlctl.engines.lora import LoraSpec
from rlctl.errors import RunError

SERVER_FIELDS = ("enable_lora", "max_lora_rank", "lora_target_modules", "max_loras_per_batch")
ENGINE_METHODS = ("load_lora_adapter", "unload_lora_adapter")


def adapter_api_gap(engine_cls: Any, server_fields: set[str]) -> str | None:
    """None when this SGLang has what adapter-only sync uses; else what it lacks."""
    missing = [f for f in SERVER_FIELDS if f not in server_fields]
    if missing:
        return f"ServerArgs has no {', '.join(missing)}"
    lacking = [m for m in ENGINE_METHODS if not hasattr(engine_cls, m)]
    if lacking:
        return f"Engine lacks {', '.join(lacking)}"
    if not accepts(engine_cls.generate, "lora_path"):
        return "Engine.generate takes no lora_path"
    return None


def installed_adapter_gap() -> str | None:
    try:
        sglang = importlib.import_module("sglang")
        server_args = importlib.import_module("sglang.srt.server_args").ServerArgs
    except ImportError:
        return "sglang not installed"
    gap = adapter_api_gap(sglang.Engine, init_fields(server_args))
    return None if gap is None else f"sglang {installed_version('sglang')}: {gap}"


class AdapterSyncFlag:
    """``SGLangRolloutEngine.adapter_sync``: on the class, whether the installed SGLang has the LoRA
    API; on an engine, whether it was built with ``lora``."""

    def __get__(self, obj, cls) -> bool:
        if obj is not None:
            return obj.lora is not None
        return installed_adapter_gap() is None


def server_lora_args(spec: LoraSpec) -> dict[str, object]:
    """The ``ServerArgs`` keywords that make room for ``spec``'s adapter (one at a time)."""
    targets = ["all"] if list(spec.target_modules) == ["all-linear"] else list(spec.target_modules)
    return dict(enable_lora=True, max_lora_rank=spec.rank, lora_target_modules=targets, max_loras_per_batch=1)


def _ok(result: Any, what: str) -> None:
    if getattr(result, "success", None) is not True:
        raise RunError(f"SGLang {what} failed: {getattr(result, 'error_message', None) or result!r}")


class AdapterPublisher:
    """Writes each synced adapter as a peft directory and swaps it into SGLang (one loaded)."""

    def __init__(self, engine: Any, spec: LoraSpec, model_path: str):
        self.engine = engine
        self.dirs = AdapterDirs(spec, model_path, "rlctl-sglang-lora-")
        self.name: str | None = None
        self.path: str | None = None

    def publish(self, tensors: dict[str, torch.Tensor]) -> str:
        """``tensors``: trainer-named LoRA tensors. Returns the new adapter's name."""
        version, where = self.dirs.write(tensors)
        if self.name is not None:  # drop the old one first: one adapter loaded at a time
            _ok(self.engine.unload_lora_adapter(lora_name=self.name), f"unload_lora_adapter({self.name!r})")
            self.dirs.drop(self.path)
        name = f"rlctl-v{version}"
        _ok(self.engine.load_lora_adapter(lora_name=name, lora_path=str(where)), f"load_lora_adapter({name!r})")
        self.name, self.path = name, str(where)
        return name
