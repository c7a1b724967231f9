"""Every node's plan and config for a launch: the experiment config with the node's place in the job written in, and
the node plan the node's supervisor runs from (trainer.runtime.plan).

The launcher (roles/ddp_config) describes the job once, with its members in order, and this module writes, for every
member, one validated YAML and one plan, plus a JSON summary on stdout. The schema, its path keys, the DDP
arithmetic and every path of a job on a node (trainer.runtime.layout) live here in the trainer, so the launcher holds
no copy of them::

    python -m trainer.node_config --config-file EXP.yaml --job job.json --out-dir DIR   # DIR/<node>.yaml, .plan.json
    ... | python -m trainer.node_config --config-file EXP.yaml --job - --out-dir DIR    # the job on stdin

The description it rendered from is kept as ``DIR/launch.json`` (layout.DESCRIPTION_FILE), so the same files can be
rendered again from it.
The description (``JobSpec.from_json``): ``{"job_id", "port", "cpu_workers", "timeout_seconds" (0 keeps the
experiment's), "resume", "overrides" (merged into the experiment), "jobs_dir", "code_root", "code_version", "env_path"
("~" = the node's home), "watch": {heartbeat_timeout, startup_timeout, stop_grace, hang_factor}, "restarts":
{max_restarts, node_wait, in_place, min_nodes (null: every trainer)}, "stragglers": {threshold, window, action,
cooldown} (trainer.runtime.job.straggler), "omp_num_threads", "extra_env", "weights_table" (bool), "nodes": [...],
"spares": [...]}``; a node is ``{"name", "ip", "gpus", "home", "iface", "devices" (ids or null)}``. The nodes are in
rank order (rank 0 hosts the rendezvous); spares train only when one replaces a lost node. The description is read by
the runtime's one schema check (trainer.runtime.schema, with defaults: a key left out takes its field's default): a key
it does not know (at the top or nested, e.g. ``watch: heartbeat_timout``, with the nearest known one), a value of the
wrong kind or a node name that is not one folder name is refused in one line naming it. Paths in the config are made
absolute for each node: "~" and relative paths are in that node's home.

Where the run goes: the config's LOG.BASE_PATH/EXP_NAME, on each node (rank 0 writes it; node rank 1 keeps a copy of
the checkpoints). GluonCV's default EXP_NAME ``use_time`` becomes the job id, so launching the job again finds its
checkpoints and resumes; when BASE_PATH is empty the run is ``<jobs_dir>/<job_id>/run``
(``<jobs_dir>/<job_id>/<EXP_NAME>`` for an explicit name).
"""

from __future__ import annotations

import argparse
import copy
import json
import posixpath
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainer.config import (
    URLS_KEY,
    Config,
    ConfigError,
    DDPConfig,
    config_to_yaml,
    input_paths,
    parse_yaml,
    path_keys,
    run_dir,
    validate_config,
)
from trainer.hf_models import HUB_FOLDER, hub_folder, hub_id
from trainer.runtime import atomic, contract, layout, schema
from trainer.runtime.job.straggler import Rules
from trainer.runtime.job.timing import MIN_HANG_FACTOR
from trainer.runtime.plan import SCHEMA as PLAN_SCHEMA
from trainer.runtime.plan import Member, NodePlan, Paths, Restarts, Watch
from trainer.runtime.schema import JsonObject

USE_TIME = "use_time"
DEFAULT_RUN_NAME = "run"
DESCRIPTION = "job description"  # how its errors name it


@dataclass(frozen=True)
class NodeFacts:
    """What the launcher knows of a node: its name, cluster address, GPU count (and device ids, when the inventory
    lists them), the cluster user's home, and the network interface that holds its cluster address."""

    name: str
    ip: str
    gpus: int
    home: str
    iface: str = ""
    devices: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if not layout.valid_job_id(self.name):  # it names a folder on every node, as a job id does
            raise ValueError(f"name {self.name!r}: use {layout.JOB_ID_CHARS}")

    @property
    def device_ids(self) -> tuple[int, ...]:
        return self.devices if self.devices is not None else tuple(range(self.gpus))


@dataclass(frozen=True)
class JobSpec:
    """The launcher's description of a job (trainer.runtime.schema with defaults: a key left out takes the default
    below; a key it does not know, a value of the wrong kind, is refused naming it)."""

    job_id: str
    port: int
    nodes: tuple[NodeFacts, ...]  # rank order
    spares: tuple[NodeFacts, ...] = ()
    cpu_workers: int = 1
    timeout_seconds: int = 0
    resume: str = "auto"
    overrides: JsonObject | None = None
    jobs_dir: str = layout.DEFAULT_JOBS_DIR
    code_root: str = layout.DEFAULT_CODE_ROOT
    code_version: str = "dev"
    env_path: str = layout.DEFAULT_ENV_PATH
    watch: Watch = field(default_factory=Watch)
    restarts: Restarts = field(default_factory=Restarts)
    stragglers: Rules = field(default_factory=Rules)
    omp_num_threads: int = 0
    extra_env: dict[str, str] | None = None
    weights_table: bool = False

    def __post_init__(self) -> None:
        if self.watch.hang_factor < MIN_HANG_FACTOR:
            raise ValueError(f"watch: hang_factor {self.watch.hang_factor:g} is below {MIN_HANG_FACTOR:g} (a slower "
                             "step would be taken for a hang)")
        if self.restarts.fault(len(self.nodes)):
            raise ValueError(self.restarts.fault(len(self.nodes)))
        names = [node.name for node in self.members]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise ValueError(f"node {', '.join(twice)} is listed more than once")

    @classmethod
    def from_json(cls, data: Any) -> JobSpec:
        """The launcher's description, checked strictly: a ConfigError naming the first fault."""
        try:
            spec = schema.parse(cls, data, DESCRIPTION, defaults=True)
        except schema.SchemaError as exc:
            raise ConfigError(str(exc)) from None
        if not layout.valid_job_id(spec.job_id):  # said as every verb says it (trainer.runtime.layout)
            raise ConfigError(f"job id {spec.job_id!r}: use {layout.JOB_ID_CHARS}")
        return spec

    @property
    def members(self) -> tuple[NodeFacts, ...]:
        """Trainers in rank order, then spares: everyone that runs a supervisor of the job."""
        return self.nodes + self.spares


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
    counts = {node.gpus for node in job.members}
    if len(counts) > 1:
        listed = ", ".join(f"{node.name}={node.gpus}" for node in job.members)
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
        "DIST_URL": f"tcp://{layout.url_host(job.nodes[0].ip)}:{job.port}",
        URLS_KEY: [node.ip for node in job.nodes],
        "GPU_WORLD_SIZE": len(job.nodes) * per_node,
        "GPU_WORLD_RANK": rank * per_node,
        "DIST_BACKEND": backend,
        "DISTRIBUTED": True,
        "CPU_WORKERS": job.cpu_workers,
        **{key: own[key] for key in DDPConfig.RUN_KEYS if key in own},  # the run's choice, not the cluster's
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


def node_config(experiment: Mapping[str, Any], job: JobSpec, node: NodeFacts, rank: int) -> Config:
    """The validated config of ``node`` as node rank ``rank`` (a spare's says rank 0: its supervisor gives the rank
    of the node it replaces when it starts).

    The experiment's own DDP_CONFIG is replaced, not merged (a single-node section, or one that spells WORLD_URLS
    the other way, must not leak into the cluster's), but for the keys it chooses for its run (DDPConfig.RUN_KEYS:
    the sharding) and its TIMEOUT_SECONDS; the job's overrides may still set DDP_CONFIG keys.
    """
    # A deep copy: the paths below are made this node's own in place, and the next node starts from the experiment.
    body = {key: copy.deepcopy(value) for key, value in experiment.items() if key != "DDP_CONFIG"}
    data = merge({"DDP_CONFIG": _ddp_section(job, rank, experiment), **body}, job.overrides or {})
    training = data.setdefault("CONFIG", {})
    training["LOG"] = {**(training.get("LOG") or {}), **_run_location(training.get("LOG") or {}, job)}
    training["TRAIN"] = {**(training.get("TRAIN") or {}), "RESUME": job.resume}
    for key in path_keys():
        value = _get_dotted(data, key)
        if isinstance(value, str) and value:
            _set_dotted(data, key, layout.node_path(value, node.home))
    hub = launch_hub(experiment, job)
    if hub is not None:  # no path of the node's: its copy of the controller's snapshot (put there by the launcher)
        _set_dotted(data, "CONFIG.MODEL.PRETRAINED_PATH", posixpath.join(node_weights_cache(node), hub_folder(hub)))
    resume = training["TRAIN"]["RESUME"]
    if resume not in ("", "auto"):
        training["TRAIN"]["RESUME"] = layout.node_path(resume, node.home)
    role = "spare" if node in job.spares else f"rank {rank}"
    return validate_config(data, f"node {node.name} ({role})")


def launch_hub(experiment: Mapping[str, Any], job: JobSpec) -> str | None:
    """The Hugging Face hub id that the job's MODEL.PRETRAINED_PATH names (:func:`trainer.hf_models.hub_id`), or None.
    The launcher resolves it on the controller and copies the snapshot into every node's weights cache
    (roles/ddp_launch/tasks/weights.yml); the node's config names that copy."""
    model = (merge(dict(experiment), job.overrides or {}).get("CONFIG") or {}).get("MODEL") or {}
    path = model.get("PRETRAINED_PATH")
    return hub_id(str(model.get("NAME", "")), model.get("LOAD") is True, path) if isinstance(path, str) else None


def node_weights_cache(node: NodeFacts) -> str:
    return layout.node_path(contract.WEIGHTS_CACHE, node.home)


def header(job: JobSpec, node: NodeFacts, rank: int, source: str) -> str:
    place = (f"a spare of job {job.job_id} (its supervisor gives it the rank of the node it replaces)"
             if node in job.spares else f"node rank {rank} of {len(job.nodes)}, job {job.job_id}")
    return (
        f"# Rendered by `python -m trainer.node_config` for {node.name}, {place}, from {source}.\n"
        "# Rendered again on every launch: change the experiment config or the inventory, not this file.\n"
    )


def node_env(job: JobSpec, node: NodeFacts, code_dir: str, job_dir: str) -> dict[str, str]:
    """The trainer's environment on the node (the supervisor adds its heartbeat and attempt variables)."""
    env = {
        "PYTHONPATH": code_dir,
        "PYTHONUNBUFFERED": "1",
        "GLOO_SOCKET_IFNAME": node.iface,  # the interface that holds the node's cluster address
        "NCCL_SOCKET_IFNAME": f"={node.iface}" if node.iface else "",  # "=": that name exactly, not a prefix of names
        "OMP_NUM_THREADS": str(job.omp_num_threads),  # 0: the supervisor divides the node's cores among workers
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",  # inventory device ids are nvidia-smi's (CUDA's default: fastest first)
        "CUDA_VISIBLE_DEVICES": ",".join(str(d) for d in node.device_ids),
    }
    if job.weights_table:
        env[contract.WEIGHTS_TABLE_ENV] = posixpath.join(job_dir, layout.SITE_WEIGHTS_TABLE)
    return {**env, **(job.extra_env or {})}


def node_plan(job: JobSpec, node: NodeFacts, cfg: Config, per_node: int, backend: str) -> NodePlan:
    """Everything ``node`` needs to run its part of the job (trainer.runtime.plan), every path absolute."""
    folder = layout.job_dir(job.jobs_dir, job.job_id, node.name, node.home)
    code = layout.code_dir(job.code_root, job.code_version, node.home)
    python = layout.env_python(job.env_path, node.home)
    config_file = posixpath.join(folder, layout.CONFIG_FILE)
    log = cfg.CONFIG.LOG
    run = str(run_dir(cfg))
    members = tuple(Member(m.name, m.ip, rank if m in job.nodes else None)
                    for rank, m in enumerate(job.members))
    return NodePlan(
        schema=PLAN_SCHEMA,
        job=job.job_id,
        node=node.name,
        members=members,
        port=job.port,
        backend=backend,
        workers=per_node,
        argv=(python, *layout.SAFE_PATH, "-m", "trainer.train", "--config-file", config_file),
        env=node_env(job, node, code, folder),
        paths=Paths(
            job_dir=folder, plan=posixpath.join(folder, layout.PLAN_FILE),
            secret=posixpath.join(folder, layout.SECRET_FILE), config=config_file,
            site_weights_table=posixpath.join(folder, layout.SITE_WEIGHTS_TABLE),
            code_archive=posixpath.join(folder, layout.CODE_ARCHIVE), code_dir=code, env_python=python, run_dir=run,
            checkpoints=posixpath.join(run, log.SAVE_DIR), status_file=posixpath.join(run, contract.STATUS_FILE),
            log_file=posixpath.join(run, log.LOG_FILENAME),
            weights_cache=node_weights_cache(node),
            results=tuple(posixpath.join(run, name) for name in contract.run_files(log.LOG_FILENAME)),
        ),
        watch=job.watch,
        restarts=job.restarts,
        stragglers=job.stragglers,
        # a hub id's snapshot arrives after the launch's check of the node's inputs: the trainer checks it
        data_paths=tuple((key, path) for key, path in input_paths(cfg)
                         if not path.startswith(posixpath.join(node_weights_cache(node), HUB_FOLDER, ""))),
    )


def render_job(experiment: Mapping[str, Any], job: JobSpec, source: str) -> dict[str, Any]:
    """Every member's YAML text and plan, and the facts the launcher needs: ``{"members": {name: {...}}, ...}``."""
    if not job.nodes:
        raise ConfigError("the job has no nodes")
    per_node, backend = workers_per_node(job)
    members: dict[str, Any] = {}
    hub = launch_hub(experiment, job)
    pretrained, model_name = hub or "", ""
    for index, node in enumerate(job.members):
        rank = index if node in job.nodes else 0
        cfg = node_config(experiment, job, node, rank)
        model = cfg.CONFIG.MODEL
        model_name = model.NAME
        if model.PRETRAINED and not model.PRETRAINED_PATH:
            pretrained = model.NAME  # published weights the nodes read from their cache: the launcher ships them
        members[node.name] = {
            "rank": rank if node in job.nodes else None,
            "yaml": header(job, node, rank, source) + config_to_yaml(cfg),
            "plan": node_plan(job, node, cfg, per_node, backend),
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
        "pretrained": pretrained,  # a zoo model's name, or a hub id (then its folder in the nodes' weights cache)
        "pretrained_folder": hub_folder(hub) if hub else "",
        "pretrained_model": model_name if hub else "",  # what the controller checks the snapshot against
        "members": members,
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


def main(argv: Sequence[str] | None = None) -> int:
    args = get_args_parser().parse_args(argv)
    try:
        described = sys.stdin.read() if args.job == "-" else Path(args.job).read_text()
        job = JobSpec.from_json(json.loads(described))
        rendered = render_job(read_experiment(args.config_file), job, str(args.config_file))
    except (ConfigError, OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for name, member in rendered["members"].items():
        member["config_file"] = str(atomic.write(args.out_dir / f"{name}.yaml", member.pop("yaml"), atomic.SHARED))
        plan: NodePlan = member.pop("plan")
        member["plan_file"] = str(atomic.write(args.out_dir / f"{name}.plan.json", plan.to_json(), atomic.SHARED))
        member["plan"] = json.loads(plan.to_json())
    atomic.write(args.out_dir / layout.DESCRIPTION_FILE, described, atomic.SHARED)
    print(json.dumps(rendered))
    return 0


if __name__ == "__main__":
    sys.exit(main())
