"""TOML profile files -> a validated Profile.

Layers, lowest first: the algorithm preset (if any), the ``extends`` chain (each file relative to
the one that names it), the profile itself, then ``--set`` overrides. Paths are resolved against
the file that sets them. Every problem is a UserError naming the file, the dotted key and what
was expected.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import sys
import types
import typing
from importlib import resources
from pathlib import Path
from typing import Any

from rlctl.errors import UserError
from rlctl.profile.fields import check_range, describe_range
from rlctl.profile.schema import SECTIONS, TOP_LEVEL_KEYS, Profile

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

_TOML_POS = re.compile(r"\(at line (\d+), column (\d+)\)")


def read_toml(path: Path) -> dict[str, Any]:
    """Parse one TOML file; syntax errors become 'file:line:col: message'."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"{path}: profile file not found") from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: cannot read profile ({type(exc).__name__})") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        msg = str(exc)
        m = _TOML_POS.search(msg)
        if m:
            msg = _TOML_POS.sub("", msg).strip()
            raise UserError(f"{path}:{m.group(1)}:{m.group(2)}: invalid TOML: {msg}") from None
        raise UserError(f"{path}: invalid TOML: {msg}") from None


def _path_keys() -> set[str]:
    return {
        f"{sec}.{f.name}"
        for sec, cls in SECTIONS.items()
        for f in dataclasses.fields(cls)
        if f.metadata.get("path")
    }


def _resolve_paths(raw: dict[str, Any], base: Path) -> None:
    """Make relative path values absolute against ``base`` (in place)."""
    for dotted in _path_keys():
        sec, key = dotted.split(".")
        table = raw.get(sec)
        if not isinstance(table, dict) or not isinstance(table.get(key), str):
            continue
        value = table[key]
        if value and ":" not in value.split("/")[0] and not Path(value).is_absolute():
            table[key] = str((base / value).resolve())
    func = raw.get("reward", {}).get("function") if isinstance(raw.get("reward"), dict) else None
    if isinstance(func, str) and ":" in func:
        file, _, name = func.rpartition(":")
        if file and not Path(file).is_absolute():
            raw["reward"]["function"] = f"{(base / file).resolve()}:{name}"


def merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """Deep-merge two raw profile dicts; ``top`` wins; tables merge, other values replace."""
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def load_layers(path: Path, _chain: tuple[Path, ...] = ()) -> tuple[dict[str, Any], dict[str, Path]]:
    """Read ``path`` and its ``extends`` ancestors; returns the merged dict and key -> defining file."""
    path = path.resolve()
    if path in _chain:
        cycle = " -> ".join(str(p) for p in (*_chain, path))
        raise UserError(f"{_chain[-1]}: extends: cyclic extends chain: {cycle}")
    raw = read_toml(path)
    _resolve_paths(raw, path.parent)
    origins = {key: path for key in _flat_keys(raw)}
    parent = raw.pop("extends", None)
    if parent is None:
        return raw, origins
    if not isinstance(parent, str):
        raise UserError(f"{path}: extends: expected a file name (string), got {_show(parent)}")
    parent_path = path.parent / parent
    if not parent_path.is_file():
        raise UserError(f"{path}: extends: file not found: {parent_path}")
    base, base_origins = load_layers(parent_path, (*_chain, path))
    return merge(base, raw), {**base_origins, **origins}


def _flat_keys(raw: dict[str, Any], prefix: str = "") -> list[str]:
    keys = []
    for key, value in raw.items():
        dotted = f"{prefix}{key}"
        keys.append(dotted)
        if isinstance(value, dict):
            keys.extend(_flat_keys(value, dotted + "."))
    return keys


def parse_override(text: str) -> tuple[str, Any]:
    """'section.key=value' -> (dotted key, TOML-typed value); bare words are strings."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not re.fullmatch(r"[A-Za-z_][\w-]*(\.[A-Za-z_][\w-]*)*", key):
        raise UserError(f"--set {text!r}: expected section.key=value")
    value = value.strip()
    try:
        return key, tomllib.loads(f"v = {value}")["v"]
    except tomllib.TOMLDecodeError:
        if re.fullmatch(r"[^\s\"'\[\]{}=,]*", value):
            return key, value
        raise UserError(f"--set {text!r}: cannot parse value {value!r} (use TOML syntax)") from None


def apply_override(raw: dict[str, Any], dotted: str, value: Any) -> None:
    """Set a dotted key in a raw profile dict (in place)."""
    parts = dotted.split(".")
    table = raw
    for part in parts[:-1]:
        table = table.setdefault(part, {})
        if not isinstance(table, dict):
            raise UserError(f"--set {dotted}: '{part}' is not a table")
    table[parts[-1]] = value


def load_preset(name: str) -> dict[str, Any]:
    """The raw dict of a named algorithm preset shipped in rlctl/profile/presets/."""
    names = available_presets()
    if name not in names:
        hint = _did_you_mean(name, names)
        raise UserError(
            f"algorithm.preset: unknown preset {name!r}{hint}; expected one of {', '.join(names)}"
        )
    text = resources.files("rlctl.profile.presets").joinpath(f"{name}.toml").read_text(encoding="utf-8")
    return tomllib.loads(text)


def available_presets() -> list[str]:
    return sorted(
        p.name.removesuffix(".toml")
        for p in resources.files("rlctl.profile.presets").iterdir()
        if p.name.endswith(".toml")
    )


def load_profile(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> Profile:
    """Load, layer, override and validate one profile file."""
    path = Path(path)
    raw, origins = load_layers(path)
    for text in overrides:
        key, value = parse_override(text)
        apply_override(raw, key, value)
        origins[key] = Path("--set")
    preset = raw.get("algorithm", {}).get("preset") if isinstance(raw.get("algorithm"), dict) else None
    if isinstance(preset, str) and preset:
        raw = merge(load_preset(preset), raw)
    profile = build_profile(raw, origins, default_file=path)
    profile.source = str(path)
    from rlctl.profile.checks import check_profile

    check_profile(profile, origins)
    return profile


def build_profile(raw: dict[str, Any], origins: dict[str, Path], default_file: Path) -> Profile:
    """Validate a raw dict against the schema and build the dataclasses."""

    def where(key: str) -> str:
        return str(origins.get(key, default_file))

    valid_top = [*TOP_LEVEL_KEYS, *SECTIONS]
    sections: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in valid_top:
            raise UserError(f"{where(key)}: unknown key '{key}'{_did_you_mean(key, valid_top)}")
        if key in SECTIONS and not isinstance(value, dict):
            raise UserError(f"{where(key)}: {key}: expected a table [{key}], got {_show(value)}")
    for name, cls in SECTIONS.items():
        sections[name] = _build_section(name, cls, raw.get(name, {}), where)
    description = raw.get("description", "")
    if not isinstance(description, str):
        raise UserError(f"{where('description')}: description: expected a string, got {_show(description)}")
    return Profile(description=description, **sections)


def _build_section(name: str, cls: type, table: dict[str, Any], where: Any) -> Any:
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for key, value in table.items():
        dotted = f"{name}.{key}"
        if key not in fields:
            all_keys = [f"{name}.{k}" for k in fields]
            raise UserError(f"{where(dotted)}: unknown key '{dotted}'{_did_you_mean(dotted, all_keys)}")
        meta = fields[key].metadata
        table_cls = nested_table(hints[key])
        if table_cls is not None:  # a sub-table such as [actor.lora]
            if not isinstance(value, dict):
                raise UserError(f"{where(dotted)}: {dotted}: expected a table [{dotted}], got {_show(value)}")
            kwargs[key] = _build_section(dotted, table_cls, value, where)
            continue
        kwargs[key] = _coerce(value, hints[key], f"{where(dotted)}: {dotted}")
        if not check_range(kwargs[key], meta):
            raise UserError(f"{where(dotted)}: {dotted}: expected {describe_range(meta)}, got {_show(value)}")
    return cls(**kwargs)


def nested_table(hint: Any) -> type | None:
    """The dataclass of a sub-table field (``X`` or ``X | None``), else None."""
    options = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    return next((o for o in options if dataclasses.is_dataclass(o)), None)


def _coerce(value: Any, hint: Any, label: str) -> Any:
    """Check ``value`` against a type hint; ints widen to float, numbers never pass as bools."""
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise UserError(f"{label}: expected true or false, got {_show(value)}")
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise UserError(f"{label}: expected an integer, got {_show(value)}")
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise UserError(f"{label}: expected a number, got {_show(value)}")
    if hint is str:
        if isinstance(value, str):
            return value
        raise UserError(f"{label}: expected a string, got {_show(value)}")
    if typing.get_origin(hint) is list:
        (item,) = typing.get_args(hint)
        if not isinstance(value, list):
            raise UserError(f"{label}: expected a list, got {_show(value)}")
        return [_coerce(v, item, f"{label}[{i}]") for i, v in enumerate(value)]
    if typing.get_origin(hint) is dict:  # a free table (rollout.engine_kwargs): checked where it is used
        if not isinstance(value, dict):
            raise UserError(f"{label}: expected a table, got {_show(value)}")
        return dict(value)
    raise TypeError(f"unsupported schema type {hint!r}")  # a schema bug, not user input


def _show(value: Any) -> str:
    kind = {bool: "boolean", int: "integer", float: "number", str: "string", list: "list", dict: "table"}
    return f"{kind.get(type(value), type(value).__name__)} {value!r}"[:80]


def _did_you_mean(word: str, options: list[str]) -> str:
    close = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""
