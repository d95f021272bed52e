"""What the installed vLLM / SGLang offers: its version, and the keywords its classes accept.

The adapters pass a keyword only when the installed release has it (both libraries raise
``TypeError`` on an unknown one) and call a method only when it exists. Keywords are read from
the classes themselves (dataclass, msgspec struct or plain ``__init__``); the version, read from
the distribution's metadata, decides what cannot be seen in a signature (log-prob semantics).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from importlib.metadata import PackageNotFoundError, version

from packaging.version import InvalidVersion, Version

from rlctl.errors import UserError


def installed_version(dist: str) -> Version:
    """The installed distribution's release (``0.10.2+cu128`` -> 0.10.2+cu128), from its metadata."""
    try:
        text = version(dist)
    except PackageNotFoundError as exc:
        raise UserError(
            f"rollout engine needs the {dist!r} distribution installed (pip install {dist})"
        ) from exc
    try:
        return Version(text)
    except InvalidVersion as exc:
        raise UserError(f"cannot read the version of {dist!r}: {text!r}") from exc


def release(v: Version) -> tuple[int, ...]:
    """``0.10.2.dev3+cu128`` -> (0, 10, 2): compare releases, not pre-release tags."""
    return v.release


def init_fields(cls: type) -> frozenset[str]:
    """Keyword names ``cls(...)`` accepts: dataclass fields, msgspec struct fields or ``__init__`` params."""
    if dataclasses.is_dataclass(cls):
        return frozenset(f.name for f in dataclasses.fields(cls) if f.init)
    struct_fields = getattr(cls, "__struct_fields__", None)  # msgspec.Struct
    if struct_fields is not None:
        return frozenset(struct_fields)
    return frozenset(
        p.name
        for p in inspect.signature(cls.__init__).parameters.values()
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "self"
    )


def field_default(cls: type, name: str) -> object:
    """The default of ``cls``'s init field ``name`` (dataclass or msgspec struct); None if it has none."""
    if dataclasses.is_dataclass(cls):
        for f in dataclasses.fields(cls):
            if f.name == name:
                return None if f.default is dataclasses.MISSING else f.default
        return None
    fields = getattr(cls, "__struct_fields__", None)
    defaults = getattr(cls, "__struct_defaults__", ())
    if fields is not None and name in fields:
        at = list(fields).index(name) - (len(fields) - len(defaults))
        return defaults[at] if at >= 0 else None
    return None


def accepts(fn: Callable, name: str) -> bool:
    """Whether ``fn`` takes a parameter called ``name`` (not counting ``**kwargs``)."""
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def only_known(kwargs: Mapping[str, object], known: frozenset[str]) -> dict[str, object]:
    """The entries of ``kwargs`` whose keys are in ``known``."""
    return {k: v for k, v in kwargs.items() if k in known}
