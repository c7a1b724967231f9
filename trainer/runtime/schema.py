"""The runtime's one schema check: a JSON value read into a frozen dataclass, or refused naming what is wrong.

Every value that crosses a door (a node plan read from disk, a job record or a message body read from the watch, a
node's state read back, the job description a launcher hands the renderer) goes through ``parse``: exactly the
dataclass's fields (a missing or an unknown key is named, with the nearest known one), each of its annotated type.
What a program writes must carry every field; what a person writes (``defaults=True``) may leave out the fields that
have defaults. Types understood: ``bool``, ``int`` (not a bool), ``float`` (an int or a float, finite),
``str``, a ``StrEnum`` (one of its values), ``X | None``, ``tuple[X, ...]``, ``tuple[X, Y]``, ``dict[str, X]``,
``JsonObject`` (any JSON object: a trainer's status.json, carried unread) and nested dataclasses.
``dump`` is the way back: plain JSON values (enums as their strings).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import types
import typing
from collections.abc import Callable, Collection, Mapping, Sequence
from enum import StrEnum
from typing import Any, TypeVar

T = TypeVar("T")
JsonObject = dict[str, Any]  # a JSON object whose contents this runtime does not read


class SchemaError(ValueError):
    """A value that does not follow its schema (the message says where and what)."""


def take(data: Any, keys: Sequence[str], where: str, optional: Collection[str] = ()) -> dict[str, Any]:
    """``data`` as an object of ``keys`` (all but ``optional`` required): a missing or an unknown key is an error
    naming it."""
    if not isinstance(data, Mapping):
        raise SchemaError(f"{where}: expected an object, got {type(data).__name__}")
    missing = [key for key in keys if key not in data and key not in optional]
    unknown = [_unknown(str(key), keys) for key in data if key not in keys]
    if missing or unknown:
        words = [f"missing {', '.join(missing)}" if missing else "", f"unknown {', '.join(unknown)}" if unknown else ""]
        raise SchemaError(f"{where}: {'; '.join(w for w in words if w)}")
    return dict(data)


def _unknown(key: str, keys: Sequence[str]) -> str:
    """An unknown key with the known one it probably misspells (a misplaced key is the usual mistake of a person)."""
    close = difflib.get_close_matches(key, keys, n=1)
    return f"{key} (did you mean {close[0]}?)" if close else f"{key} (known: {', '.join(keys)})"


@functools.cache
def _fields(cls: type) -> tuple[tuple[str, Any], ...]:
    hints = typing.get_type_hints(cls)
    return tuple((f.name, hints[f.name]) for f in dataclasses.fields(cls))


def parse(cls: type[T], data: Any, where: str, error: type[SchemaError] = SchemaError, defaults: bool = False) -> T:
    """``data`` (decoded JSON) as a ``cls``, every field checked; ``error`` naming the first fault. ``defaults``: a
    field that has a default may be left out (in nested objects too)."""
    try:
        return typing.cast(T, _value(cls, data, where, defaults))
    except SchemaError as exc:
        raise error(str(exc)) from None


def parse_some(cls: type, data: Any, names: Sequence[str], where: str,
               error: type[SchemaError] = SchemaError) -> dict[str, Any]:
    """Some of ``cls``'s fields (any of ``names``, no other) from decoded JSON, each checked as ``parse`` checks it."""
    hints = dict(_fields(cls))
    try:
        if not isinstance(data, Mapping):
            raise SchemaError(f"{where}: expected an object, got {type(data).__name__}")
        unknown = [str(key) for key in data if key not in names]
        if unknown:
            raise SchemaError(f"{where}: unknown {', '.join(unknown)}")
        return {key: _value(hints[key], value, f"{where}: {key}") for key, value in data.items()}
    except SchemaError as exc:
        raise error(str(exc)) from None


@functools.cache
def _defaulted(cls: type) -> frozenset[str]:
    """The fields of ``cls`` that have a default."""
    return frozenset(f.name for f in dataclasses.fields(cls)
                     if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING)


def _value(kind: Any, value: Any, where: str, defaults: bool = False) -> Any:
    if dataclasses.is_dataclass(kind):
        fields = _fields(typing.cast(type, kind))
        given = take(value, [name for name, _ in fields], where, _defaulted(kind) if defaults else ())
        values = {name: _value(hint, given[name], f"{where}: {name}", defaults)
                  for name, hint in fields if name in given}  # a field left out keeps its default
        try:
            return typing.cast(Callable[..., Any], kind)(**values)
        except ValueError as exc:  # a rule of the dataclass's own (its __post_init__)
            raise SchemaError(f"{where}: {exc}") from None
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (types.UnionType, typing.Union):
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _value(inner, value, where, defaults)
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise SchemaError(f"{where}: expected a list, got {type(value).__name__}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_value(args[0], item, f"{where}[{i}]", defaults) for i, item in enumerate(value))
        if len(value) != len(args):
            raise SchemaError(f"{where}: expected {len(args)} items, got {len(value)}")
        return tuple(_value(a, item, f"{where}[{i}]", defaults)
                     for i, (a, item) in enumerate(zip(args, value, strict=True)))
    if origin is dict:
        if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
            raise SchemaError(f"{where}: expected an object, got {type(value).__name__}")
        return {k: (v if args[1] is Any else _value(args[1], v, f"{where}: {k}", defaults)) for k, v in value.items()}
    if isinstance(kind, type) and issubclass(kind, StrEnum):
        if value not in {m.value for m in kind}:
            raise SchemaError(f"{where}: {value!r} is not one of {', '.join(m.value for m in kind)}")
        return kind(value)
    return _scalar(kind, value, where)


def _scalar(kind: Any, value: Any, where: str) -> Any:
    if kind is bool and isinstance(value, bool):
        return value
    if kind is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if kind is float and isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    if kind is str and isinstance(value, str):
        return value
    if kind in (bool, int, float, str):
        raise SchemaError(f"{where}: expected {kind.__name__}, got {type(value).__name__} {str(value)[:40]!r}")
    raise TypeError(f"{where}: the schema cannot check {kind!r}")  # a dataclass of this runtime is wrong


def dump(value: Any) -> Any:
    """A dataclass (or anything ``parse`` reads) as plain JSON values."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: dump(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, StrEnum):
        return value.value
    if isinstance(value, Mapping):
        return {k: dump(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [dump(v) for v in value]
    return value
