"""Engine registry keyed by (kind, model_type, backend, device[, vendor]).

Engines register with :func:`register_engine`; workers look them up with :func:`get_engine`.
Lookup falls back from the most specific entry to the most generic one::

    vendor + device + model_type -> vendor + device -> device + model_type -> device
    -> model_type (any device) -> generic ("*" model, "*" device)

An engine registered with ``vendor=`` runs on the named vendors only: vLLM registers for
(``cuda``, ``nvidia``), (``cuda``, ``rocm``) and (``npu``, ``ascend``), SGLang for NVIDIA and ROCm;
a lookup for another vendor finds nothing, and the platforms' ``engine_order`` lists only engines
registered for their vendor (a test holds the two together).

The built-in engines register when their modules are imported; that happens lazily on the first
lookup so importing the registry stays cheap. Out-of-tree engines register through the
``rlctl.engines`` entry-point group: each entry point is loaded (importing it runs its
``@register_engine`` decorators; if it is a callable taking no arguments it is also called).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any, TypeVar

from rlctl.errors import UserError
from rlctl.log import get_logger

KINDS = ("train", "rollout")
ENTRY_POINT_GROUP = "rlctl.engines"
BUILTIN_MODULES = (
    "rlctl.engines.fsdp_train",
    "rlctl.engines.hf_rollout",
    "rlctl.engines.vllm_rollout",
    "rlctl.engines.sglang_rollout",
)

T = TypeVar("T")


@dataclass(frozen=True)
class EngineKey:
    """One registry slot; ``"*"`` means any model type / any device, ``vendor=None`` any vendor."""

    kind: str
    model_type: str
    backend: str
    device: str
    vendor: str | None = None

    def __str__(self) -> str:
        vendor = f", vendor={self.vendor}" if self.vendor else ""
        return f"{self.kind}:{self.backend}(model_type={self.model_type}, device={self.device}{vendor})"


_REGISTRY: dict[EngineKey, Any] = {}
_loaded = False


def register_engine(
    kind: str, model_type: str = "*", backend: str = "fsdp2", device: str = "*", vendor: str | None = None
) -> Callable[[T], T]:
    """Class/factory decorator: register under the given key (a later registration replaces)."""
    if kind not in KINDS:
        raise ValueError(f"engine kind must be one of {KINDS}, got {kind!r}")

    def deco(obj: T) -> T:
        _REGISTRY[EngineKey(kind, model_type, backend, device, vendor)] = obj
        return obj

    return deco


def _load_plugins() -> None:
    """Import the built-in engine modules and the ``rlctl.engines`` entry points, once."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    for module in BUILTIN_MODULES:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
    log = get_logger("rlctl.engines")
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            obj = ep.load()
        except Exception as exc:  # a broken plugin must not hide the built-ins
            log.warning("engine plugin failed to load", entry_point=ep.name, error=str(exc))
            continue
        if callable(obj) and not isinstance(obj, type):
            obj()


def _candidates(kind: str, model_type: str, backend: str, device: str, vendor: str | None) -> list[EngineKey]:
    keys: list[EngineKey] = []
    if vendor:
        keys += [
            EngineKey(kind, model_type, backend, device, vendor),
            EngineKey(kind, "*", backend, device, vendor),
            EngineKey(kind, model_type, backend, "*", vendor),
            EngineKey(kind, "*", backend, "*", vendor),
        ]
    keys += [
        EngineKey(kind, model_type, backend, device),
        EngineKey(kind, "*", backend, device),
        EngineKey(kind, model_type, backend, "*"),
        EngineKey(kind, "*", backend, "*"),
    ]
    return keys


def registered(kind: str | None = None) -> list[EngineKey]:
    """All registered keys (optionally of one kind), sorted for display."""
    _load_plugins()
    return sorted((k for k in _REGISTRY if kind is None or k.kind == kind), key=str)


def runs_on(kind: str, backend: str, device: str, vendor: str | None) -> bool:
    """Whether :func:`get_engine` finds ``backend`` for this device and vendor (any model type)."""
    try:
        get_engine(kind, "*", backend, device, vendor)
    except UserError:
        return False
    return True


def get_engine(
    kind: str, model_type: str, backend: str, device: str = "cpu", vendor: str | None = None
) -> Any:
    """The most specific engine class registered for this key; UserError lists what exists.

    An engine registered for named vendors on a device (vLLM on ``cuda`` for ``nvidia`` and
    ``rocm``) is found only for those vendors (vendor-free entries are the fallbacks): an engine
    never runs on a vendor it was not registered for."""
    _load_plugins()
    for key in _candidates(kind, model_type, backend, device, vendor):
        if key in _REGISTRY:
            return _REGISTRY[key]
    have = ", ".join(str(k) for k in registered(kind)) or "none"
    raise UserError(
        f"no {kind} engine for backend={backend!r}, model_type={model_type!r}, device={device!r}"
        f"{f', vendor={vendor!r}' if vendor else ''}; registered: {have}"
    )
