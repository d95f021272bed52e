"""A toy accelerator module, registered the way a vendor's torch extension registers its device:
``torch._register_device_module(device_type, module)`` (torch 2.13 ``torch/__init__.py``; torch_npu
calls it as ``torch._register_device_module('npu', torch_npu.npu)``, PyTorch's PrivateUse1 guide).

Imported as a platform's ``torch_module``; it registers ``torch.ve`` with three devices whose
calls are recorded in ``CALLS`` (the CPU host has no such device: this is the boundary)."""

from __future__ import annotations

import torch

CALLS: list[tuple[str, object]] = []


class _Ve:
    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def device_count() -> int:
        return 3

    @staticmethod
    def set_device(device: torch.device) -> None:
        CALLS.append(("set_device", device))

    @staticmethod
    def synchronize() -> None:
        CALLS.append(("synchronize", None))

    @staticmethod
    def empty_cache() -> None:
        CALLS.append(("empty_cache", None))

    @staticmethod
    def max_memory_allocated() -> int:
        return 5 << 20


if not hasattr(torch, "ve"):
    torch._register_device_module("ve", _Ve)
