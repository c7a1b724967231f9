"""Config files: read YAML (GluonCV's floats too), apply ``KEY VALUE`` overrides, validate, dump; the paths a config
reads, the run's folder, and the schema described for the docs."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from trainer.config.messages import _error, _schema_keys
from trainer.config.schema import Config
from trainer.config.section import URLS_ALIAS, URLS_KEY, ConfigError, _expand_user
from trainer.runtime.contract import run_name


class _Loader(yaml.SafeLoader):
    """SafeLoader that also reads ``1e-4`` as a float (YAML 1.1 wants ``1.0e-4``; GluonCV files write ``1e-4``)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def parse_yaml(text: str) -> Any:
    """Parse YAML the way config files and override values are read (safe, ``1e-4`` is a float)."""
    return yaml.load(text, Loader=_Loader)


def _canonical_key(key: str) -> str:
    return f"DDP_CONFIG.{URLS_KEY}" if key == f"DDP_CONFIG.{URLS_ALIAS}" else key


def _set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    *sections, leaf = key.split(".")
    node = data
    for i, part in enumerate(sections):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {key}: {'.'.join(sections[: i + 1])} is a value, not a section")
        node = child
    if leaf == URLS_KEY and sections == ["DDP_CONFIG"]:
        node.pop(URLS_ALIAS, None)  # the override replaces the list whichever spelling the file used
    node[leaf] = value


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Apply ``KEY VALUE`` pairs (dotted keys, values parsed as YAML) to a raw config dict, in place."""
    if len(overrides) % 2:
        raise ConfigError(f"overrides come in KEY VALUE pairs; {overrides[-1]!r} has no value")
    for key, text in zip(overrides[::2], overrides[1::2], strict=True):
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*", key):
            raise ConfigError(f"override {key!r}: not a dotted key such as CONFIG.TRAIN.BATCH_SIZE")
        try:
            value = "" if text == "" else parse_yaml(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"override {key}: value {text!r} is not valid YAML ({exc})") from exc
        _set_dotted(data, _canonical_key(key), value)
    return data


def validate_config(data: Any, source: str = "config") -> Config:
    """Build a Config from a raw dict; any problem becomes one ConfigError listing every bad key."""
    try:
        return Config.model_validate(data if data is not None else {})
    except ValidationError as exc:
        raise _error(source, exc) from None


def load_config(path: str | Path, overrides: Sequence[str] = ()) -> Config:
    """Read a YAML config, apply ``KEY VALUE`` overrides, validate. GPU availability is checked by check_runtime."""
    path = Path(path)
    try:
        data = parse_yaml(path.read_text())
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the config file ({exc.strerror})") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    if data is not None and not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping with DDP_CONFIG and CONFIG sections")
    data = apply_overrides(data or {}, overrides)
    source = f"{path} (with overrides)" if overrides else str(path)
    return validate_config(data, source)


def config_to_dict(cfg: Config) -> dict[str, Any]:
    """Plain nested dict of the config (keys as GluonCV writes them), safe to dump or store in a checkpoint."""
    return cfg.model_dump(mode="json")


def dump_config(cfg: Config, path: str | Path) -> None:
    """Write the resolved config as YAML that load_config reads back to an equal Config."""
    Path(path).write_text(config_to_yaml(cfg))


def config_to_yaml(cfg: Config) -> str:
    return yaml.safe_dump(config_to_dict(cfg), sort_keys=False, default_flow_style=False)


def path_keys(model: type[BaseModel] = Config, prefix: str = "") -> list[str]:
    """Dotted keys of every path in the schema (the ``UserPath`` fields), e.g. ``CONFIG.DATA.TRAIN_ANNO_PATH``."""
    keys: list[str] = []
    for name, field in model.model_fields.items():
        sub = _schema_keys(model)[name]
        if sub is not None:
            keys += path_keys(sub, f"{prefix}{name}.")
        elif any(getattr(meta, "func", None) is _expand_user for meta in field.metadata):
            keys.append(prefix + name)
    return keys


def input_paths(cfg: Config) -> list[tuple[str, str]]:
    """(dotted key, path) of every file or folder the trainer reads before it starts: the data lists, their video
    roots, the class index and fine-tuning weights. A launcher checks them on every node first."""
    data, model = cfg.CONFIG.DATA, cfg.CONFIG.MODEL
    found = [(f"CONFIG.DATA.{key}", getattr(data, key)) for key in
             ("TRAIN_ANNO_PATH", "TRAIN_DATA_PATH", "VAL_ANNO_PATH", "VAL_DATA_PATH", "CLASS_INDEX")]
    if model.LOAD or model.PRETRAINED:  # the file to start from, or a local copy of the published weights
        found.append(("CONFIG.MODEL.PRETRAINED_PATH", model.PRETRAINED_PATH))
    return [(key, path) for key, path in found if path]


def run_dir(cfg: Config, now: float | None = None) -> Path:
    """LOG.BASE_PATH/EXP_NAME; EXP_NAME '' is BASE_PATH itself, 'use_time' the start time (now) as GluonCV names it."""
    log = cfg.CONFIG.LOG
    base = Path(log.BASE_PATH)
    if log.EXP_NAME == "use_time":
        return base / run_name(now)
    return base / log.EXP_NAME if log.EXP_NAME else base


def describe_schema() -> str:
    """Every key with its default and meaning, as a Markdown table: the config reference (docs/CONFIG.md)."""
    defaults = config_to_dict(Config())
    rows = ["| key | default | meaning |", "|---|---|---|"]

    def walk(model: type[BaseModel], values: dict[str, Any], prefix: str) -> None:
        for name, field in model.model_fields.items():
            sub = _schema_keys(model)[name]
            if sub is not None:
                walk(sub, values[name], f"{prefix}{name}.")
            else:
                default = yaml.safe_dump(values[name], default_flow_style=True).strip().removesuffix("...").strip()
                rows.append(f"| `{prefix}{name}` | `{default}` | {field.description} |")

    walk(Config, defaults, "")
    return "\n".join(rows) + "\n"
