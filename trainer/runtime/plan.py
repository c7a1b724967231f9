"""The node plan: everything one node needs to run its part of a job, in one JSON file per node and launch.

The trainer's renderer writes it (``python -m trainer.node_config``, on the controller, which owns the config schema
and every path; see trainer.runtime.layout); the launcher copies it into the node's job folder and calls the
supervisor, which reads nothing else. Reading checks the schema: a plan from another version of this file, or a
hand-edited one with a wrong key, is refused naming the key.

Members are the job's trainers in node-rank order, then its spares. Attempt 0 starts every trainer with the rank
and rendezvous port the plan gives; a later attempt's ranks and rendezvous come from the job's hub (the ``start``
message of trainer.runtime.watch.wire), added to ``argv`` as config overrides.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from trainer.runtime import schema
from trainer.runtime.job.straggler import Rules
from trainer.runtime.job.timing import DEFAULT_HANG_FACTOR, Timings

SCHEMA = 1


class PlanError(schema.SchemaError):
    """A plan file that does not follow this schema (the message names the key)."""


@dataclass(frozen=True)
class Member:
    """A node of the job: a trainer (``rank``: the node rank it starts with) or a spare (``rank`` None)."""

    name: str
    ip: str
    rank: int | None

    @property
    def spare(self) -> bool:
        return self.rank is None


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


@dataclass(frozen=True)
class Watch:
    """How the nodes watch each other (seconds); every interval of the watch derives from these
    (trainer.runtime.job.timing). The defaults are the job description's (trainer.node_config): a plan carries all."""

    heartbeat_timeout: float = 60.0  # no news for this long: a trainer froze or a node is lost
    startup_timeout: float = 300.0  # a member that has not joined the watch this long after the start is lost
    stop_grace: float = 15.0  # SIGTERM (and the trainer's checkpoint at a common step) to SIGKILL
    # a rank whose step stalls this many times its usual step time is hung (vidcluster_hang_factor)
    hang_factor: float = DEFAULT_HANG_FACTOR


@dataclass(frozen=True)
class Restarts:
    """The restart policy (trainer.runtime.job.policy)."""

    max_restarts: int = 3  # automatic restarts of the job after failures, in all
    node_wait: float = 300.0  # seconds to wait for a lost node to come back when no spare can replace it
    in_place: bool = True  # restart in place: a trainer that survived a failure goes on in its process, a standby waits
    # the fewest nodes the job trains on: a lost node no spare can replace leaves the world while this many are left
    # (vidcluster_min_nodes); None: every trainer (the job never shrinks)
    min_nodes: int | None = None

    def fault(self, trainers: int) -> str:
        """Why these settings cannot be a job's of ``trainers`` nodes ('' when they can)."""
        if self.min_nodes is not None and not 1 <= self.min_nodes <= trainers:
            return f"restarts: min_nodes {self.min_nodes} must be between 1 and the job's {trainers} trainers"
        return ""


@dataclass(frozen=True)
class NodePlan:
    schema: int
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
    stragglers: Rules  # when a node is named slow, and what the hub does then (trainer.runtime.job.straggler)
    data_paths: tuple[tuple[str, str], ...]  # (config key, path) of every input the config reads

    def __post_init__(self) -> None:
        if self.schema != SCHEMA:
            raise PlanError(f"schema {self.schema!r}, this runtime reads schema {SCHEMA} (launch again)")
        if self.node not in {m.name for m in self.members}:
            raise PlanError(f"node {self.node!r} is not among the job's members")
        if self.restarts.fault(len(self.trainers)):
            raise PlanError(self.restarts.fault(len(self.trainers)))
        self.timings  # noqa: B018 (refuses a watch that breaks the no-split rule, naming the rule)

    @property
    def timings(self) -> Timings:
        return Timings.derive(self.watch.heartbeat_timeout, self.watch.stop_grace, self.restarts.node_wait,
                              self.watch.hang_factor)

    @property
    def me(self) -> Member:
        return next(m for m in self.members if m.name == self.node)

    @property
    def trainers(self) -> list[Member]:
        return [m for m in self.members if not m.spare]

    @property
    def world_size(self) -> int:
        """Nodes that train at the launch (a lost node is replaced by a spare, or leaves: ``min_nodes``)."""
        return len(self.trainers)

    @property
    def min_nodes(self) -> int:
        """The fewest nodes the job trains on (trainer.runtime.job.policy)."""
        return self.world_size if self.restarts.min_nodes is None else self.restarts.min_nodes

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1) + "\n"

    @classmethod
    def from_dict(cls, data: Any, where: str = "plan") -> NodePlan:
        return schema.parse(cls, data, where, PlanError)

    @classmethod
    def read(cls, path: str) -> NodePlan:
        try:
            with open(path) as handle:
                data = json.load(handle)
        except (OSError, ValueError) as exc:
            raise PlanError(f"{path}: cannot read the node plan ({exc})") from None
        return cls.from_dict(data, path)
