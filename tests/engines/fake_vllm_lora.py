"""The LoRA part of the fake ``vllm`` (see :mod:`tests.engines.fakes`), from the released source.

- ``vllm.lora.request.LoRARequest``: a msgspec struct with the surface's fields; ``lora_int_id < 1``
  is a ``ValueError`` from 0.13 and an empty ``lora_path`` an ``AssertionError``
  (``vllm/lora/request.py`` ``__post_init__``).
- ``LLM.llm_engine`` (``vllm/v1/engine/llm_engine.py``): ``add_lora`` / ``remove_lora`` /
  ``list_loras`` with the recorded signatures; absent where the surface has no ``LLMEngine``.
- Loading (``vllm/lora/worker_manager.py`` ``_load_adapter``): ``adapter_config.json`` is read
  (``PEFTHelper.validate_legal``: rank above ``max_lora_rank``, ``modules_to_save`` other than
  classifier/score, bias: ``ValueError``), tensors from ``adapter_model.safetensors`` under peft's
  saved names. The LRU cache holds ``max_loras`` adapters (``LRUCacheWorkerLoRAManager``: the
  oldest is evicted). A request whose id is not loaded is loaded from its path by generate().
- Generation with an adapter computes with ``W + B @ A * alpha / r`` (set on the HF model, the
  base parameters vLLM reports stay as they were); a ``lora_request`` on an engine without
  ``enable_lora`` is the ``ValueError`` of ``vllm/v1/engine/processor.py`` ``_validate_lora``.
"""

from __future__ import annotations

import json
import types
from pathlib import Path

import torch

PREFIX = "base_model.model."


def lora_modules(s: dict, rel: tuple[int, ...], msgspec_type, recorded_method) -> dict[str, types.ModuleType]:
    """``vllm.lora.request`` and ``vllm.v1.engine.llm_engine`` of this surface (none it lacks)."""
    out: dict[str, types.ModuleType] = {}
    if s.get("LoRARequest"):
        base = msgspec_type("LoRARequest", s["LoRARequest"]["fields"], {"lora_path": ""})

        def __post_init__(self):
            if rel >= (0, 13) and self.lora_int_id < 1:
                raise ValueError(f"id must be > 0, got {self.lora_int_id}")
            assert self.lora_path, "lora_path cannot be empty"

        request_mod = types.ModuleType("vllm.lora.request")
        request_mod.LoRARequest = type("LoRARequest", (base,), {"__post_init__": __post_init__})
        out["vllm.lora"] = types.ModuleType("vllm.lora")
        out["vllm.lora.request"] = request_mod
    if s.get("LLMEngine"):
        impls = {"add_lora": LoraHolder.add, "remove_lora": LoraHolder.remove, "list_loras": LoraHolder.ids}
        methods = {
            name: recorded_method(f"LLMEngine.{name}", spec, impls[name])
            for name, spec in s["LLMEngine"]["methods"].items()
        }
        engine_mod = types.ModuleType("vllm.v1.engine.llm_engine")
        engine_mod.LLMEngine = type("LLMEngine", (LoraHolder,), methods)
        out["vllm.v1"] = types.ModuleType("vllm.v1")
        out["vllm.v1.engine"] = types.ModuleType("vllm.v1.engine")
        out["vllm.v1.engine.llm_engine"] = engine_mod
    return out


class LoraHolder:
    """The workers' LoRA cache and which adapter the HF model computes with."""

    def __init__(self, args, hf, calls: list):
        self.args, self.hf, self.calls = args, hf, calls
        self.held: dict[int, dict[str, torch.Tensor]] = {}  # id -> HF weight name -> delta
        self.applied: tuple[int | None, dict[str, torch.Tensor]] = (None, {})
        self.names: dict[str, int] = {}  # SGLang: adapter name -> key in held

    def add(self, lora_request) -> bool:
        self.calls.append(("add_lora", lora_request.lora_int_id, lora_request.lora_path))
        if not getattr(self.args, "enable_lora", False):
            raise ValueError("LoRA is not enabled. Use --enable-lora to enable LoRA.")
        if lora_request.lora_int_id in self.held:
            return False  # vLLM: already loaded, not reloaded
        deltas = self._load(Path(lora_request.lora_path))
        while len(self.held) >= int(getattr(self.args, "max_loras", 1) or 1):
            self.held.pop(next(iter(self.held)))  # LRU: the oldest goes
        self.held[lora_request.lora_int_id] = deltas
        return True

    def remove(self, lora_id) -> bool:
        self.calls.append(("remove_lora", lora_id))
        return self.held.pop(lora_id, None) is not None

    def ids(self) -> set[int]:
        return set(self.held)

    def _load(self, path: Path) -> dict[str, torch.Tensor]:
        from safetensors.torch import load_file

        config = json.loads((path / "adapter_config.json").read_text())
        errors = []
        saved = [m for m in config.get("modules_to_save") or [] if m not in ("classifier", "score")]
        if saved:
            errors.append(f"vLLM only supports modules_to_save being either None or ... Unsupported modules_to_save: {saved}")
        if int(config["r"]) > int(self.args.max_lora_rank):
            errors.append(f"LoRA rank {config['r']} is greater than max_lora_rank {self.args.max_lora_rank}.")
        if config.get("bias", "none") != "none":
            errors.append("Adapter bias is not supported.")
        if errors:
            raise ValueError(" ".join(errors))
        tensors = load_file(str(path / "adapter_model.safetensors"))
        scaling = float(config["lora_alpha"]) / float(config["r"])
        deltas = {}
        for key, a in tensors.items():
            if ".lora_A." not in key:
                continue
            assert key.startswith(PREFIX), key
            module = key[len(PREFIX) :].removesuffix(".lora_A.weight")
            b = tensors[key.replace(".lora_A.", ".lora_B.")]
            deltas[f"{module}.weight"] = (b.double() @ a.double()) * scaling
        return deltas

    def use(self, lora_request) -> None:
        """Compute with ``lora_request``'s adapter (None: the base), loading it if not held."""
        if lora_request is not None and not getattr(self.args, "enable_lora", False):
            raise ValueError(f"Got lora_request {lora_request} but LoRA is not enabled!")
        wanted = None if lora_request is None else lora_request.lora_int_id
        if wanted is not None and wanted not in self.held:
            self.add(lora_request)
        if self.applied[0] == wanted:
            return
        params = dict(self.hf.model.named_parameters())
        with torch.no_grad():
            for name, delta in self.applied[1].items():
                params[name].copy_((params[name].double() - delta).to(params[name].dtype))
            new = {} if wanted is None else self.held[wanted]
            for name, delta in new.items():
                params[name].copy_((params[name].double() + delta).to(params[name].dtype))
        self.applied = (wanted, new)


class SGLangLoras(LoraHolder):
    """The fake SGLang engine's adapters by name (``Engine.load_lora_adapter`` / ``unload_lora_adapter``,
    ``sglang/srt/entrypoints/engine.py`` 0.5.3 and 0.5.23): each returns a ``LoRAUpdateOutput``
    (``success``, ``error_message``, ``loaded_adapters``; ``managers/io_struct.py``); a name loaded
    twice or unloaded when absent is ``success=False``; ``generate(lora_path=[name, ...])`` needs
    the names loaded and ``enable_lora``."""

    def _out(self, success: bool, error: str | None = None):
        return types.SimpleNamespace(success=success, error_message=error, loaded_adapters=dict(self.names))

    def load(self, lora_name, lora_path, pinned=False):
        self.calls.append(("load_lora_adapter", lora_name, lora_path))
        if not getattr(self.args, "enable_lora", False):
            return self._out(False, "LoRA is not enabled")
        if lora_name in self.names:
            return self._out(False, f"The LoRA adapter {lora_name} is already loaded")
        try:
            deltas = self._load(Path(lora_path))
        except (ValueError, OSError) as exc:
            return self._out(False, str(exc))
        key = len(self.names) + 1 + max(self.held, default=0)
        self.held[key], self.names[lora_name] = deltas, key
        return self._out(True)

    def unload(self, lora_name):
        self.calls.append(("unload_lora_adapter", lora_name))
        if lora_name not in self.names:
            return self._out(False, f"LoRA adapter {lora_name} is not loaded")
        self.held.pop(self.names.pop(lora_name))
        return self._out(True)

    def use_names(self, lora_path) -> None:
        names = set(lora_path or []) - {None}
        if names and not getattr(self.args, "enable_lora", False):
            raise ValueError("The server is not configured to enable LoRA.")
        if len(names) > 1:
            raise AssertionError("the fake computes one adapter per generate() call")
        name = next(iter(names), None)
        if name is not None and name not in self.names:
            raise ValueError(f"The following requested LoRA adapters are not loaded: {name}")
        key = None if name is None else self.names[name]
        request = None if key is None else types.SimpleNamespace(lora_int_id=key)
        self.use(request)
