"""``DeviceRuntime``: one platform's devices as torch calls, from the platform's ``RuntimeSpec``.

As torchtitan's ``get_device_info`` and vLLM's platform classes do, the device module is
``torch.<device_type>`` (``torch.cuda`` on NVIDIA and ROCm, ``torch.npu`` once ``torch_npu`` is
imported, ``torch.xpu``, ...): a vendor whose devices torch exposes that way needs no runtime code
of its own, only the ``RuntimeSpec`` its platform declares.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

from rlctl.platforms.runtime_spec import RuntimeSpec


class DeviceRuntime:
    """The device calls of one platform (CPU: every accelerator call is a no-op)."""

    def __init__(self, spec: RuntimeSpec) -> None:
        self.spec = spec
        self._module: Any = None

    def __repr__(self) -> str:
        return f"<DeviceRuntime {self.spec.device_type} ({self.spec.dist_backend})>"

    @property
    def device_type(self) -> str:
        return self.spec.device_type

    @property
    def dist_backend(self) -> str:
        """The collective backend ``torch.distributed`` is initialised with on these devices."""
        return self.spec.dist_backend

    @property
    def module(self) -> Any | None:
        """``torch.<device_type>`` (None on CPU), after importing the module that registers the
        device with torch where the platform names one (``torch_npu``)."""
        if self.spec.is_cpu:
            return None
        if self._module is None:
            if self.spec.torch_module:
                importlib.import_module(self.spec.torch_module)
            module = getattr(torch, self.spec.device_type, None)
            if module is None:
                raise RuntimeError(
                    f"torch has no torch.{self.spec.device_type} module"
                    + (f" (is {self.spec.torch_module} installed?)" if self.spec.torch_module else "")
                )
            self._module = module
        return self._module

    def device(self, index: int | None = None) -> torch.device:
        """The torch device at ``index`` (None: the first one this process sees)."""
        if self.spec.is_cpu:
            return torch.device("cpu")
        return torch.device(self.spec.device_type, 0 if index is None else index)

    def is_available(self) -> bool:
        """Whether torch can use these devices in this process (always on CPU)."""
        if self.spec.is_cpu:
            return True
        try:
            module = self.module
        except (ImportError, RuntimeError):
            return False
        return bool(getattr(module, "is_available", lambda: False)())

    def device_count(self) -> int:
        """Devices torch sees in this process (1 for the CPU)."""
        if self.spec.is_cpu:
            return 1
        return int(self.module.device_count()) if self.is_available() else 0

    def set_device(self, index: int | None = None) -> None:
        """Make ``index`` this process's current device (a no-op on CPU or with no device)."""
        if not self.spec.is_cpu and self.is_available():
            self.module.set_device(self.device(index))

    def synchronize(self) -> None:
        """Wait for the device's queued work (a no-op on CPU)."""
        fn = getattr(self.module, "synchronize", None)
        if fn is not None:
            fn()

    def empty_cache(self) -> None:
        """Return the caching allocator's free blocks to the device (a no-op on CPU)."""
        fn = getattr(self.module, "empty_cache", None)
        if fn is not None:
            fn()

    def peak_memory_bytes(self) -> int | None:
        """The allocator's peak since the process started; None on CPU or where the device module
        keeps no statistics."""
        fn = getattr(self.module, "max_memory_allocated", None)
        return None if fn is None else int(fn())


def runtime_of(device: torch.device | str) -> DeviceRuntime:
    """The runtime of an engine's ``device`` when only the device is known (engines get a torch
    device, not a platform): the module is ``torch.<type>``, the backend torch's default for it."""
    device_type = torch.device(device).type
    if device_type == "cpu":
        return DeviceRuntime(RuntimeSpec())
    backends = getattr(torch.distributed, "Backend", None)
    default = getattr(backends, "default_device_backend_map", {}) if backends is not None else {}
    # no Ray resource: an engine schedules nothing
    return DeviceRuntime(RuntimeSpec(device_type, default.get(device_type, "gloo"), ray_resource=""))
