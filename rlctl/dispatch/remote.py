"""``remote(Worker.method)``: a typed worker-group handle's declaration of one worker method.

A role's handle is a ``WorkerGroup`` subclass that declares each worker method the driver calls,
``sync_weights = remote(PolicyWorker.sync_weights)``. The driver's ``group.sync_weights(...)``
then resolves, for a reader, an editor and a type checker, to that worker method (its parameters
and return type), where the plain group attaches its methods at run time; a renamed worker method
fails at import instead of at the first call. At run time the call is the group's usual one
(``timeout=`` and ``blocking=`` are accepted as with any group method).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, overload

from rlctl.dispatch.modes import SPEC_ATTR

P = ParamSpec("P")
R = TypeVar("R")


class Remote(Generic[P, R]):
    """One declared worker method of a typed handle: on an instance, the group's call of it."""

    def __init__(self, method: Callable[Concatenate[Any, P], R]) -> None:
        if getattr(method, SPEC_ATTR, None) is None:
            raise TypeError(f"{method.__qualname__} is not a @register'd worker method")
        self.method = method
        self.name = method.__name__

    def __set_name__(self, owner: type, name: str) -> None:
        if name != self.name:
            raise TypeError(f"{owner.__name__}.{name} declares {self.method.__qualname__}: use its name")

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> Remote[P, R]: ...

    @overload
    def __get__(self, obj: object, owner: type | None = None) -> Callable[P, R]: ...

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        return obj.method(self.name)


def remote(method: Callable[Concatenate[Any, P], R]) -> Remote[P, R]:
    """Declare ``method`` (a ``@register``'d worker method) on a typed worker-group handle."""
    return Remote(method)


def declared_methods(handle: type) -> dict[str, Remote]:
    """The worker methods ``handle`` (a WorkerGroup subclass) declares, by name."""
    out: dict[str, Remote] = {}
    for cls in reversed(handle.__mro__):
        out.update({name: v for name, v in vars(cls).items() if isinstance(v, Remote)})
    return out
