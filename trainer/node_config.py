"""Every node's config for a launch: the experiment config with the node's place in the job written in.

The launcher (roles/ddp_config) describes the job once, in rank order, and this module writes one validated YAML per
node plus a JSON summary of what the launcher needs next (folders, data paths to check, workers). The schema, its
path keys and the DDP arithmetic live here in the trainer, so the launcher holds no copy of them::

    python -m trainer.node_config --config-file EXP.yaml --job job.json --out-dir DIR   # DIR/<node>.yaml + JSON
    ... | python -m trainer.node_config --config-file EXP.yaml --job - --out-dir DIR    # the job on stdin

The description it rendered from is kept as ``DIR/job.json``, so the same configs can be rendered again from it.
``job.json``: ``{"job_id", "port", "cpu_workers", "timeout_seconds" (0 keeps the experiment's), "resume",
"overrides" (merged into the experiment), "jobs_dir" ("~" = the node's home), "nodes": [{"name", "ip", "gpus",
"home"}, ...]}`` with the nodes in rank order (rank 0 hosts the rendezvous). Paths in the config are made absolute
for each node: "~" and relative paths are in that node's home.

Where the run goes: the config's LOG.BASE_PATH/EXP_NAME on the rank-0 node. GluonCV's default EXP_NAME
``use_time`` becomes the job id, so launching the job again finds its checkpoints and resumes; when BASE_PATH is
empty the run is ``<jobs_dir>/<job_id>/run`` (``<jobs_dir>/<job_id>/<EXP_NAME>`` for an explicit name). Each node's
own files (its config, job.json, pid, log) live in ``<jobs_dir>/<job_id>/<node>`` (roles/ddp_launch), so nodes that
share a home directory never write the same file.
"""

from __future__ import annotations

import argparse
import json
import posixpath
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer.config import (
    URLS_KEY,
    Config,
    ConfigError,
    config_to_yaml,
    input_paths,
    parse_yaml,
    path_keys,
    validate_config,
)

USE_TIME = "use_time"
DEFAULT_RUN_NAME = "run"


@dataclass(frozen=True)
class NodeFacts:
    """What the launcher knows of a node: its name, cluster address, GPU count and the cluster user's home."""

    name: str
    ip: str
    gpus: int
    home: str


@dataclass(frozen=True)
class JobSpec:
    job_id: str
    port: int
    nodes: tuple[NodeFacts, ...]  # rank order
    cpu_workers: int = 1
    timeout_seconds: int = 0
    resume: str = "auto"
    overrides: Mapping[str, Any] | None = None
    jobs_dir: str = "~/vidcluster/jobs"

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> JobSpec:
        nodes = tuple(NodeFacts(str(n["name"]), str(n["ip"]), int(n["gpus"]), str(n["home"])) for n in data["nodes"])
        return cls(
            job_id=str(data["job_id"]),
            port=int(data["port"]),
            nodes=nodes,
            cpu_workers=int(data.get("cpu_workers", 1)),
            timeout_seconds=int(data.get("timeout_seconds", 0)),
            resume=str(data.get("resume", "auto")),
            overrides=data.get("overrides") or {},
            jobs_dir=str(data.get("jobs_dir", "~/vidcluster/jobs")),
        )


def node_path(path: str, home: str) -> str:
    """A path as the node sees it: ``~`` and relative paths are in the node user's home, absolute ones stay."""
    if path == "~" or path.startswith("~/"):
        return posixpath.normpath(home + path[1:])
    if posixpath.isabs(path):
        return path
    return posixpath.normpath(posixpath.join(home, path))


def url_host(address: str) -> str:
    """An address as the host part of a URL (IPv6 in brackets)."""
    return f"[{address}]" if ":" in address else address


def merge(base: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """Recursive merge: mappings merge key by key, anything else in ``extra`` replaces what ``base`` has."""
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def workers_per_node(job: JobSpec) -> tuple[int, str]:
    """(worker processes per node, backend): one per GPU with nccl, CPU_WORKERS with gloo; every node alike."""
    counts = {node.gpus for node in job.nodes}
    if len(counts) > 1:
        listed = ", ".join(f"{node.name}={node.gpus}" for node in job.nodes)
        raise ConfigError(
            f"nodes have different numbers of GPUs ({listed}); the trainer starts the same number of workers on "
            "every node, so give every node the same gpus in the inventory (a count, or a list of device ids)"
        )
    gpus = counts.pop()
    return (gpus, "nccl") if gpus > 0 else (job.cpu_workers, "gloo")


def _ddp_section(job: JobSpec, rank: int, experiment: Mapping[str, Any]) -> dict[str, Any]:
    per_node, backend = workers_per_node(job)
    own = experiment.get("DDP_CONFIG") or {}
    timeout = job.timeout_seconds or own.get("TIMEOUT_SECONDS")
    section = {
        "AUTO_RANK_MATCH": False,
        "WORLD_SIZE": len(job.nodes),
        "WORLD_RANK": rank,
        "DIST_URL": f"tcp://{url_host(job.nodes[0].ip)}:{job.port}",
        URLS_KEY: [node.ip for node in job.nodes],
        "GPU_WORLD_SIZE": len(job.nodes) * per_node,
        "GPU_WORLD_RANK": rank * per_node,
        "DIST_BACKEND": backend,
        "DISTRIBUTED": True,
        "CPU_WORKERS": job.cpu_workers,
    }
    return section if timeout is None else {**section, "TIMEOUT_SECONDS": timeout}


def _run_location(log: Mapping[str, Any], job: JobSpec) -> dict[str, Any]:
    base, name = log.get("BASE_PATH") or "", log.get("EXP_NAME", USE_TIME)
    if not base:
        return {"BASE_PATH": f"{job.jobs_dir}/{job.job_id}",
                "EXP_NAME": name if name not in (USE_TIME, "") else DEFAULT_RUN_NAME}
    return {"BASE_PATH": base, "EXP_NAME": job.job_id if name == USE_TIME else name}


def _set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    *sections, leaf = key.split(".")
    node = data
    for part in sections:
        node = node.setdefault(part, {})
    node[leaf] = value


def _get_dotted(data: Mapping[str, Any], key: str) -> Any:
    node: Any = data
    for part in key.split("."):
        if not isinstance(node, Mapping):
            return None
        node = node.get(part)
    return node


def node_config(experiment: Mapping[str, Any], job: JobSpec, rank: int) -> Config:
    """The validated config of the node with this rank.

    The experiment's own DDP_CONFIG is replaced, not merged (a single-node section, or one that spells WORLD_URLS
    the other way, must not leak into the cluster's); the job's overrides may still set DDP_CONFIG keys.
    """
    node = job.nodes[rank]
    body = {key: value for key, value in experiment.items() if key != "DDP_CONFIG"}
    data = merge({"DDP_CONFIG": _ddp_section(job, rank, experiment), **body}, job.overrides or {})
    training = data.setdefault("CONFIG", {})
    training["LOG"] = {**(training.get("LOG") or {}), **_run_location(training.get("LOG") or {}, job)}
    training["TRAIN"] = {**(training.get("TRAIN") or {}), "RESUME": job.resume}
    for key in path_keys():
        value = _get_dotted(data, key)
        if isinstance(value, str) and value:
            _set_dotted(data, key, node_path(value, node.home))
    resume = training["TRAIN"]["RESUME"]
    if resume not in ("", "auto"):
        training["TRAIN"]["RESUME"] = node_path(resume, node.home)
    return validate_config(data, f"node {node.name} (rank {rank})")


def header(job: JobSpec, rank: int, source: str) -> str:
    node = job.nodes[rank]
    return (
        f"# Rendered by `python -m trainer.node_config` for {node.name}, node rank {rank} of {len(job.nodes)}, job "
        f"{job.job_id}, from {source}.\n# Rendered again on every launch: change the experiment config or the "
        "inventory, not this file.\n"
    )


def render_job(experiment: Mapping[str, Any], job: JobSpec, source: str) -> dict[str, Any]:
    """Every node's YAML text and the facts the launcher needs, ``{"nodes": {name: {...}}, ...}``."""
    if not job.nodes:
        raise ConfigError("the job has no nodes")
    per_node, backend = workers_per_node(job)
    nodes: dict[str, Any] = {}
    pretrained = ""
    for rank, node in enumerate(job.nodes):
        cfg = node_config(experiment, job, rank)
        model = cfg.CONFIG.MODEL
        if model.PRETRAINED and not model.PRETRAINED_PATH:
            pretrained = model.NAME  # published weights the nodes read from their cache: the launcher ships them
        log = cfg.CONFIG.LOG
        run = posixpath.join(log.BASE_PATH, log.EXP_NAME) if log.EXP_NAME else log.BASE_PATH
        nodes[node.name] = {
            "rank": rank,
            "yaml": header(job, rank, source) + config_to_yaml(cfg),
            "run_dir": run,
            "status_file": posixpath.join(run, "status.json"),
            "data_paths": [{"key": key, "path": path} for key, path in input_paths(cfg)],
        }
    return {
        "job_id": job.job_id,
        "world_size": len(job.nodes),
        "workers_per_node": per_node,
        "processes": per_node * len(job.nodes),
        "backend": backend,
        "root": job.nodes[0].name,
        "root_ip": job.nodes[0].ip,
        "port": job.port,
        "pretrained": pretrained,
        "nodes": nodes,
    }


def read_experiment(path: Path) -> dict[str, Any]:
    try:
        data = parse_yaml(path.read_text())
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the config file ({exc.strerror})") from exc
    except Exception as exc:  # yaml.YAMLError, with its position
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping with DDP_CONFIG and CONFIG sections")
    return data


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m trainer.node_config",
        description="write every node's validated config of a launch and print what the launcher needs (JSON)",
        add_help=add_help,
    )
    parser.add_argument("--config-file", type=Path, required=True, help="the experiment config (GluonCV DDP format)")
    parser.add_argument("--job", required=True, help="the job description: a JSON file, or - for stdin")
    parser.add_argument("--out-dir", type=Path, required=True, help="folder for <node>.yaml, one per node")
    return parser


def _write_atomically(path: Path, text: str) -> Path:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    args = get_args_parser().parse_args(argv)
    try:
        described = sys.stdin.read() if args.job == "-" else Path(args.job).read_text()
        job = JobSpec.from_json(json.loads(described))
        rendered = render_job(read_experiment(args.config_file), job, str(args.config_file))
    except (ConfigError, OSError, ValueError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for name, node in rendered["nodes"].items():
        node["config"] = str(_write_atomically(args.out_dir / f"{name}.yaml", node.pop("yaml")))
    _write_atomically(args.out_dir / "job.json", described)
    print(json.dumps(rendered))
    return 0


if __name__ == "__main__":
    sys.exit(main())
