"""Filters of the ddp_config role: read an experiment config, lay the nodes out in rank order, build a node's
DDP_CONFIG section and make a node's paths absolute.

Plain functions, so tests import this file directly; ``FilterModule`` only registers them for Ansible.
"""

from __future__ import annotations

import ipaddress
import posixpath
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import yaml


class _Loader(yaml.SafeLoader):
    """SafeLoader that reads ``1e-4`` as a float, as the trainer does (YAML 1.1 alone makes it a string, and the
    trainer's strict schema would then reject the rendered file)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)

# Keys whose values are files or folders the trainer reads on the node (checked there before the start).
DATA_PATH_KEYS = ("TRAIN_ANNO_PATH", "TRAIN_DATA_PATH", "VAL_ANNO_PATH", "VAL_DATA_PATH", "CLASS_INDEX")


def experiment_from_yaml(text: str, source: str = "config") -> dict[str, Any]:
    """The experiment config as a dict (``1e-4`` is a float); anything but a mapping is an error."""
    try:
        data = yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as exc:
        raise ValueError(f"{source}: not valid YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"{source}: the top level must be a mapping with DDP_CONFIG and CONFIG sections")
    return data


def gpu_count(gpus: Any) -> int:
    """``gpus`` of the inventory: a count, or a list of device indices (CUDA_VISIBLE_DEVICES)."""
    if isinstance(gpus, list | tuple):
        return len(gpus)
    return int(gpus)


def layout(nodes: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Rank order and totals of the job from one entry per node: ``{name, node_rank (or None), cluster_ip, gpus}``.

    Ranks come from ``node_rank`` when every node has one (each of 0..N-1 exactly once), else from inventory order
    (the order of ``nodes``); some-but-not-all is an error. Every node must use the same number of GPUs (the
    trainer gives each node the same number of workers). Returns ``errors`` (a list of sentences) next to the
    layout, so the caller can fail with all of them at once.
    """
    errors: list[str] = []
    names = [str(n["name"]) for n in nodes]
    given = {str(n["name"]): n.get("node_rank") for n in nodes}
    with_rank = [name for name in names if given[name] is not None]
    order = list(names)
    if with_rank and len(with_rank) != len(names):
        missing = ", ".join(name for name in names if given[name] is None)
        errors.append(f"node_rank is set for some nodes but not for {missing}; set it for every node or none")
    elif with_rank:
        ranks = {name: int(given[name]) for name in names}
        if sorted(ranks.values()) != list(range(len(names))):
            listed = ", ".join(f"{name}={rank}" for name, rank in ranks.items())
            errors.append(f"node_rank must number the nodes 0..{len(names) - 1}, each once; got {listed}")
        else:
            order = sorted(names, key=ranks.__getitem__)
    by_name = {str(n["name"]): n for n in nodes}
    urls = [str(by_name[name]["cluster_ip"]) for name in order]
    for url in sorted(set(urls)):
        holders = [name for name in order if str(by_name[name]["cluster_ip"]) == url]
        if len(holders) > 1:
            errors.append(f"cluster_ip {url} is given to several nodes ({', '.join(holders)}); each needs its own")
    counts = {name: gpu_count(by_name[name]["gpus"]) for name in order}
    if len(set(counts.values())) > 1:
        listed = ", ".join(f"{name}={count}" for name, count in counts.items())
        errors.append(
            f"nodes use different numbers of GPUs ({listed}); the trainer starts the same number of workers on "
            "every node, so give every node the same gpus (a count, or a list of device indices)"
        )
    per_node = counts[order[0]] if order else 0
    return {
        "order": order,
        "ranks": {name: rank for rank, name in enumerate(order)},
        "urls": urls,
        "root": order[0] if order else "",
        "gpus_per_node": per_node,
        "errors": errors,
    }


def url_host(address: str) -> str:
    """An address as the host part of a URL (IPv6 in brackets)."""
    try:
        return f"[{address}]" if ipaddress.ip_address(address).version == 6 else address
    except ValueError:
        return address


def ddp_section(plan: Mapping[str, Any], node: str, port: int, cpu_workers: int, timeout: int) -> dict[str, Any]:
    """A node's DDP_CONFIG: explicit ranks (no AUTO_RANK_MATCH), nccl with GPUs, gloo without."""
    gpus = int(plan["gpus_per_node"])
    nodes = len(plan["order"])
    per_node = gpus if gpus > 0 else int(cpu_workers)
    return {
        "AUTO_RANK_MATCH": False,
        "WORLD_SIZE": nodes,
        "WORLD_RANK": int(plan["ranks"][node]),
        "DIST_URL": f"tcp://{url_host(plan['urls'][0])}:{int(port)}",
        "WOLRD_URLS": list(plan["urls"]),
        "GPU_WORLD_SIZE": nodes * per_node,
        "GPU_WORLD_RANK": int(plan["ranks"][node]) * per_node,
        "DIST_BACKEND": "nccl" if gpus > 0 else "gloo",
        "DISTRIBUTED": True,
        "CPU_WORKERS": int(cpu_workers),
        "TIMEOUT_SECONDS": int(timeout),
    }


def node_path(path: str, home: str) -> str:
    """A path as the node sees it: ``~`` and relative paths are in the node user's home, absolute ones stay."""
    if path == "~" or path.startswith("~/"):
        return posixpath.normpath(home + path[1:])
    if posixpath.isabs(path):
        return path
    return posixpath.normpath(posixpath.join(home, path))


def node_paths(config: Mapping[str, Any], home: str) -> dict[str, Any]:
    """The config with every file path the trainer reads made absolute for this node (empty values stay empty)."""
    result = {key: dict(value) if isinstance(value, Mapping) else value for key, value in config.items()}
    section = dict(result.get("CONFIG") or {})
    for name, keys in (("DATA", DATA_PATH_KEYS), ("MODEL", ("PRETRAINED_PATH",))):
        values = dict(section.get(name) or {})
        for key in keys:
            if isinstance(values.get(key), str) and values[key]:
                values[key] = node_path(values[key], home)
        if values:
            section[name] = values
    train = dict(section.get("TRAIN") or {})
    if isinstance(train.get("RESUME"), str) and train["RESUME"] not in ("", "auto"):
        train["RESUME"] = node_path(train["RESUME"], home)
        section["TRAIN"] = train
    result["CONFIG"] = section
    return result


def _merge(base: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """Recursive merge: mappings merge key by key, anything else in ``extra`` replaces what ``base`` has."""
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def node_config(
    experiment: Mapping[str, Any],
    ddp: Mapping[str, Any],
    overrides: Mapping[str, Any],
    job_dir: str,
    resume: str,
    home: str,
) -> dict[str, Any]:
    """A node's config: the experiment (its DDP_CONFIG replaced by ``ddp``), then ``overrides`` merged in, the run
    directory set to ``<job_dir>/run`` and every path made absolute for this node.

    The experiment's own DDP_CONFIG is dropped rather than merged: a single-node section (or one that spells
    WORLD_URLS the other way) must not leak into the cluster's. ``overrides`` may still set DDP_CONFIG keys.
    """
    body = {key: value for key, value in experiment.items() if key != "DDP_CONFIG"}
    config = _merge({"DDP_CONFIG": dict(ddp), **body}, overrides)
    run = {"CONFIG": {"LOG": {"BASE_PATH": job_dir, "EXP_NAME": "run"}, "TRAIN": {"RESUME": resume}}}
    return node_paths(_merge(config, run), home)


def data_paths(config: Mapping[str, Any]) -> list[dict[str, str]]:
    """``[{key, path}]`` of the data files and folders a config names (dotted keys, empty values left out)."""
    found = []
    data = (config.get("CONFIG") or {}).get("DATA") or {}
    for key in DATA_PATH_KEYS:
        value = data.get(key)
        if isinstance(value, str) and value:
            found.append({"key": f"CONFIG.DATA.{key}", "path": value})
    model = (config.get("CONFIG") or {}).get("MODEL") or {}
    if model.get("LOAD") and model.get("PRETRAINED_PATH"):
        found.append({"key": "CONFIG.MODEL.PRETRAINED_PATH", "path": str(model["PRETRAINED_PATH"])})
    return found


class FilterModule:
    """Registers the functions above as Ansible filters."""

    def filters(self) -> dict[str, Callable[..., Any]]:
        return {
            "ddp_config_from_yaml": experiment_from_yaml,
            "ddp_config_layout": layout,
            "ddp_config_ddp_section": ddp_section,
            "ddp_config_node_config": node_config,
            "ddp_config_node_path": node_path,
            "ddp_config_data_paths": data_paths,
        }
