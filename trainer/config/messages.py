"""A validation error as the user reads it: one line per bad key, naming the full dotted key, and for an unknown
key the one it probably meant."""

from __future__ import annotations

import difflib
from collections.abc import Sequence

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from trainer.config.schema import Config
from trainer.config.section import ConfigError


def _schema_keys(model: type[BaseModel], prefix: str = "") -> dict[str, type[BaseModel] | None]:
    """Every dotted key of the schema -> its section model (None for a leaf)."""
    keys: dict[str, type[BaseModel] | None] = {}
    for name, field in model.model_fields.items():
        sub = (
            field.annotation if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel) else None
        )
        keys[prefix + name] = sub
        if sub is not None:
            keys.update(_schema_keys(sub, f"{prefix}{name}."))
    return keys


def _nearest_key(section: str, name: str) -> str:
    """Where an unknown key probably belongs: the same name in another section, else the closest valid key."""
    keys = _schema_keys(Config)
    elsewhere = [k for k in keys if k.rsplit(".", 1)[-1] == name]
    if elsewhere:
        return " or ".join(elsewhere)
    prefix = f"{section}." if section else ""
    siblings = [k.removeprefix(prefix) for k in keys if k.startswith(prefix) and "." not in k.removeprefix(prefix)]
    close = difflib.get_close_matches(name, siblings, n=1, cutoff=0.6)
    if close:
        return prefix + close[0]
    leaves = {k.rsplit(".", 1)[-1]: k for k in reversed(keys)}
    close = difflib.get_close_matches(name, list(leaves), n=1, cutoff=0.6)
    if close:
        return leaves[close[0]]
    return prefix + difflib.get_close_matches(name, siblings, n=1, cutoff=0.0)[0]


def _dotted(loc: Sequence[str | int]) -> str:
    key = ""
    for part in loc:
        key += f"[{part}]" if isinstance(part, int) else (f".{part}" if key else str(part))
    return key


def _describe(error: ErrorDetails) -> str:
    loc = [p for p in error["loc"] if not (isinstance(p, str) and p.startswith("function-"))]
    ctx = error.get("ctx") or {}
    if error["type"] == "extra_forbidden":
        section, name = _dotted(loc[:-1]), str(loc[-1])
        return f"{_dotted(loc)}: unknown key; did you mean {_nearest_key(section, name)}?"
    if error["type"] == "key":
        return f"{_dotted([*loc, ctx['key']])}: {ctx['message']}"
    return f"{_dotted(loc)}: {error['msg'].removeprefix('Value error, ')}, got {error['input']!r}"


def _error(source: str, exc: ValidationError) -> ConfigError:
    lines = [_describe(e) for e in exc.errors()]
    if len(lines) == 1:
        return ConfigError(f"{source}: {lines[0]}")
    return ConfigError(f"{source}: {len(lines)} problems:\n  " + "\n  ".join(lines))
