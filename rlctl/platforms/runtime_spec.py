"""``RuntimeSpec``: what the platform's runtime half needs to know about its devices, as plain data.

The declarative half (a ``Platform``) hands it out (:meth:`Platform.runtime_spec`); the runtime half
(:mod:`rlctl.devices`, the one room that imports torch for devices) turns it into calls. It is
frozen and picklable, so a worker process receives it with its context and never needs the
platform object, and JSON-able, so doctor's child processes receive it in one variable.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class RuntimeSpec:
    """One platform's devices: torch's name for them (``torch.<device_type>`` is their module),
    the collective backend, the Ray resource they are scheduled as, the variable that restricts
    which ones a process sees, the module that must be imported before torch knows them
    (``torch_npu`` on Ascend; None where torch itself does), and the vendor's
    ``RAY_EXPERIMENTAL_NOSET_*`` variable that stops Ray narrowing that visibility per worker
    (read from Ray's ``_private/accelerators/<vendor>.py``; None where Ray has none)."""

    device_type: str = "cpu"
    dist_backend: str = "gloo"
    ray_resource: str = "CPU"
    visible_devices_env: str | None = None
    torch_module: str | None = None
    ray_noset_env: str | None = None

    @property
    def is_cpu(self) -> bool:
        return self.device_type == "cpu"

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> RuntimeSpec:
        return cls(**json.loads(text))


CPU_RUNTIME = RuntimeSpec()
