"""Reading a parsed YAML mapping into the configuration's frozen dataclasses (``config.py``).

Generic over the sections: a YAML key is the camelCase of a field's snake_case name (``camel``);
``build`` rejects unknown keys (naming the known ones), coerces each value to its field's type
(bool, int, finite float, str, enum, list into tuple, string-keyed mapping, a nested section)
with a ``ConfigError`` naming the dotted key, and then asks the section to check its own rules
(its ``validate(prefix)``, where it has one). ``merge`` applies overrides to a built section (a
node's ``devicePlugin`` keys). Pure: no file is read here.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

from vgpu.core import errors

T = TypeVar("T")


def camel(name: str) -> str:
    """The YAML key of field ``name`` (``lease_timeout_s`` -> ``leaseTimeoutS``)."""
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


def bad(prefix: str, name: str, message: str) -> errors.ConfigError:
    """The error for field ``name`` of the section at ``prefix`` ("" at the top)."""
    return errors.ConfigError(f"{prefix}.{camel(name)}" if prefix else camel(name), message)


def coerce(value: Any, kind: Any, key: str) -> Any:
    origin = typing.get_origin(kind)
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        try:
            return kind(value)
        except ValueError:
            allowed = ", ".join(str(m.value) for m in kind)
            raise errors.ConfigError(key, f"{value!r} is not one of {allowed}") from None
    if kind is bool:
        if not isinstance(value, bool):
            raise errors.ConfigError(key, f"expected true or false, got {value!r}")
        return value
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise errors.ConfigError(key, f"expected an integer, got {value!r}")
        return value
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise errors.ConfigError(key, f"expected a number, got {value!r}")
        try:
            number = float(value)
        except OverflowError:  # an integer beyond a float's range
            number = math.inf
        if not math.isfinite(number):  # .nan slips past every range check, .inf means never
            raise errors.ConfigError(key, f"expected a finite number, got {value!r}")
        return number
    if kind is str:
        if not isinstance(value, str):
            raise errors.ConfigError(key, f"expected a string, got {value!r}")
        return value
    if dataclasses.is_dataclass(kind) and isinstance(kind, type):
        return build(kind, value, key)
    if origin is dict:
        if not isinstance(value, Mapping):
            raise errors.ConfigError(key, "expected a mapping")
        for k in value:
            if not isinstance(k, str):  # YAML reads `on:` as true and `0123:` as 83: str() renames them
                raise errors.ConfigError(f"{key}.{k}", f"the key {k!r} is not a string: quote it")
        return dict(value)
    if origin in (list, tuple):
        if not isinstance(value, list | tuple):  # tuple: a default merged back by for_node
            raise errors.ConfigError(key, "expected a list")
        (item_kind, *_) = typing.get_args(kind)
        return tuple(coerce(v, item_kind, f"{key}[{i}]") for i, v in enumerate(value))
    if origin in (types.UnionType, typing.Union):
        if value is None and types.NoneType in typing.get_args(kind):
            return None
        (first, *_) = [a for a in typing.get_args(kind) if a is not types.NoneType]
        return coerce(value, first, key)
    raise errors.ConfigError(key, f"unsupported type {kind!r}")  # a bug in config.py, not user input


def build(cls: type[T], raw: Any, prefix: str) -> T:
    """Section ``cls`` from the mapping ``raw`` (None: the defaults) found at ``prefix``."""
    where = prefix or "config"
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise errors.ConfigError(where, f"expected a mapping, got {type(raw).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {camel(f.name): f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    kwargs: dict[str, Any] = {}
    for key, value in raw.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        f = fields.get(str(key))
        if f is None:
            known = ", ".join(sorted(fields))
            raise errors.ConfigError(dotted, f"unknown key (known keys: {known})")
        kwargs[f.name] = coerce(value, hints[f.name], dotted)
    obj = cls(**kwargs)
    validate = getattr(obj, "validate", None)
    if validate is not None:
        validate(prefix)
    return obj


def merge(section: T, override: Mapping[str, Any], prefix: str) -> T:
    """``section`` with the camelCase keys of ``override`` applied, built and checked again."""
    base = {camel(f.name): getattr(section, f.name) for f in dataclasses.fields(section)}  # type: ignore[arg-type]
    merged = {**base, **override}
    return build(type(section), merged, prefix)
