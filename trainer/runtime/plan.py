"""The node plan: everything one node needs to run its part of a job, in one JSON file per node and launch.

The trainer's renderer writes it (``python -m trainer.node_config``, on the controller, which owns the config schema
and every path; see trainer.runtime.layout); the launcher copies it into the node's job folder and calls the
supervisor, which reads nothing else. Reading checks the schema: a plan from another version of this file, or a
hand-edited one with a wrong key, is refused naming the key.

Members are the job's trainers in node-rank order, then its spares. Attempt 0 starts every trainer with the rank
and rendezvous port the plan gives; a later attempt's ranks and rendezvous come from the job's hub (the ``start``
message of trainer.runtime.wire), added to ``argv`` as config overrides.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

SCHEMA = 1


class PlanError(ValueError):
    """A plan file that does not follow this schema (the message names the key)."""


def _take(data: Mapping[str, Any], keys: Sequence[str], where: str) -> dict[str, Any]:
    """``data`` restricted to exactly ``keys``: a missing or an unknown key is an error naming it."""
    if not isinstance(data, Mapping):
        raise PlanError(f"{where}: expected an object, got {type(data).__name__}")
    missing = [key for key in keys if key not in data]
    unknown = [key for key in data if key not in keys]
    if missing or unknown:
        words = [f"missing {', '.join(missing)}" if missing else "", f"unknown {', '.join(unknown)}" if unknown else ""]
        raise PlanError(f"{where}: {'; '.join(w for w in words if w)}")
    return dict(data)


@dataclass(frozen=True)
class Member:
    """A node of the job: a trainer (``rank``: the node rank it starts with) or a spare (``rank`` None)."""

    name: str
    ip: str
    rank: int | None

    @property
    def spare(self) -> bool:
        return self.rank is None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str) -> Member:
        d = _take(data, ("name", "ip", "rank"), where)
        return cls(str(d["name"]), str(d["ip"]), None if d["rank"] is None else int(d["rank"]))


@dataclass(frozen=True)
class Paths:
    """Every path of the node's part of the job, absolute (a node's "~" already expanded)."""

    job_dir: str
    plan: str
    secret: str
    config: str
    site_weights_table: str
    code_archive: str
    code_dir: str
    env_python: str
    run_dir: str
    checkpoints: str
    status_file: str
    log_file: str
    weights_cache: str
    results: tuple[str, ...]  # the run's files the launcher collects when the job ends (metrics.jsonl first)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str) -> Paths:
        names = [f for f in cls.__dataclass_fields__ if f != "results"]
        d = _take(data, [*names, "results"], where)
        return cls(**{name: str(d[name]) for name in names}, results=tuple(str(p) for p in d["results"]))


@dataclass(frozen=True)
class Watch:
    """How the nodes watch each other (seconds)."""

    heartbeat_timeout: float  # no news for this long: a trainer froze or a node is lost
    startup_timeout: float  # a member that has not joined the watch this long after the start is lost
    stop_grace: float  # SIGTERM (and the trainer's checkpoint at a common step) to SIGKILL

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str) -> Watch:
        return cls(**{k: float(v) for k, v in _take(data, list(cls.__dataclass_fields__), where).items()})


@dataclass(frozen=True)
class Restarts:
    """The restart policy (trainer.runtime.policy)."""

    max_restarts: int  # automatic restarts of the job after failures, in all
    node_wait: float  # seconds to wait for a lost node to come back when no spare can replace it

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str) -> Restarts:
        d = _take(data, list(cls.__dataclass_fields__), where)
        return cls(int(d["max_restarts"]), float(d["node_wait"]))


@dataclass(frozen=True)
class NodePlan:
    job: str
    node: str
    members: tuple[Member, ...]  # trainers in node-rank order, then spares: the order hubs succeed each other in
    port: int  # attempt 0's rendezvous port on the rank-0 node
    backend: str  # nccl or gloo
    workers: int  # training processes per node
    argv: tuple[str, ...]  # the trainer's command (the attempt's overrides are appended)
    env: dict[str, str]  # the trainer's environment on top of the supervisor's
    paths: Paths
    watch: Watch
    restarts: Restarts
    data_paths: tuple[tuple[str, str], ...]  # (config key, path) of every input the config reads

    @property
    def me(self) -> Member:
        return next(m for m in self.members if m.name == self.node)

    @property
    def trainers(self) -> list[Member]:
        return [m for m in self.members if not m.spare]

    @property
    def world_size(self) -> int:
        """Nodes that train (every attempt keeps it: a lost node is replaced, never dropped)."""
        return len(self.trainers)

    def to_json(self) -> str:
        data = asdict(self)
        data["schema"] = SCHEMA
        return json.dumps(data, indent=1) + "\n"

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "plan") -> NodePlan:
        keys = ["schema", *cls.__dataclass_fields__]
        d = _take(data, keys, where)
        if d["schema"] != SCHEMA:
            raise PlanError(f"{where}: schema {d['schema']!r}, this runtime reads schema {SCHEMA} (launch again)")
        plan = cls(
            job=str(d["job"]),
            node=str(d["node"]),
            members=tuple(Member.from_dict(m, f"{where}: members[{i}]") for i, m in enumerate(d["members"])),
            port=int(d["port"]),
            backend=str(d["backend"]),
            workers=int(d["workers"]),
            argv=tuple(str(a) for a in d["argv"]),
            env={str(k): str(v) for k, v in d["env"].items()},
            paths=Paths.from_dict(d["paths"], f"{where}: paths"),
            watch=Watch.from_dict(d["watch"], f"{where}: watch"),
            restarts=Restarts.from_dict(d["restarts"], f"{where}: restarts"),
            data_paths=tuple((str(k), str(p)) for k, p in d["data_paths"]),
        )
        if plan.node not in {m.name for m in plan.members}:
            raise PlanError(f"{where}: node {plan.node!r} is not among the job's members")
        return plan

    @classmethod
    def read(cls, path: str) -> NodePlan:
        try:
            with open(path) as handle:
                data = json.load(handle)
        except (OSError, ValueError) as exc:
            raise PlanError(f"{path}: cannot read the node plan ({exc})") from None
        return cls.from_dict(data, path)
