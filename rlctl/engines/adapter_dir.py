"""A LoRA actor's adapter as the external engines load it: a peft adapter directory per sync.

vLLM (``LoRARequest.lora_path``) and SGLang (``Engine.load_lora_adapter(lora_name, lora_path)``)
take an adapter by directory: ``adapter_config.json`` + ``adapter_model.safetensors`` under peft's
saved names (:func:`rlctl.engines.lora.adapter_state`). Each sync writes one under a private
folder in shared memory (``/dev/shm``) where there is one; the previous one is deleted once the
engine has dropped it, the folder when the writer goes. ``modules_to_save`` is left out of the
config (vLLM refuses it; the trained copies load into the base model in place instead).
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
import weakref
from collections.abc import Iterable
from pathlib import Path

import torch

from rlctl.engines.lora import ADAPTER, ADAPTER_FILE, LoraSpec, adapter_state, base_name, is_adapter
from rlctl.errors import RunError

SHM = Path("/dev/shm")


def split_adapter_stream(
    stream: Iterable[tuple[str, torch.Tensor]],
) -> tuple[dict[str, torch.Tensor], list[tuple[str, torch.Tensor]]]:
    """An ``export_adapter`` stream -> (LoRA tensors by trainer name, ``modules_to_save`` copies
    under the base model's names, to load in place)."""
    lora: dict[str, torch.Tensor] = {}
    saved = []
    for name, tensor in stream:
        if is_adapter(name):
            lora[name] = tensor
        elif f".modules_to_save.{ADAPTER}." in name:
            saved.append((base_name(name), tensor))
        else:
            raise RunError(f"LoRA sync got {name!r}, neither an adapter nor a modules_to_save tensor")
    return lora, saved


class AdapterDirs:
    """Writes version-numbered peft adapter directories (``v1``, ``v2``, ...)."""

    def __init__(self, spec: LoraSpec, model_path: str, prefix: str):
        self.spec = dataclasses.replace(spec, modules_to_save=())
        self.model_path = model_path
        self.root = Path(tempfile.mkdtemp(prefix=prefix, dir=SHM if SHM.is_dir() else None))
        self._cleanup = weakref.finalize(self, shutil.rmtree, str(self.root), True)
        self.version = 0

    def write(self, tensors: dict[str, torch.Tensor]) -> tuple[int, Path]:
        """The next version's directory holding ``tensors`` (trainer-named LoRA tensors)."""
        from safetensors.torch import save_file

        self.version += 1
        where = self.root / f"v{self.version}"
        where.mkdir()
        state = {n: t.detach().to("cpu").contiguous() for n, t in tensors.items()}
        save_file(adapter_state(state), str(where / ADAPTER_FILE), metadata={"format": "pt"})
        self.spec.peft_config(base_model_path=self.model_path).save_pretrained(str(where))
        return self.version, where

    @staticmethod
    def drop(path: str | Path) -> None:
        shutil.rmtree(path, ignore_errors=True)
