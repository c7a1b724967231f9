"""The job's record: the job as its members know it, a typed value that the hub alone changes
(trainer.runtime.job.hub) and every member keeps the newest of.

It says which attempt runs and in which phase, which member has which node rank, the attempt's rendezvous, every
attempt so far (what ended the one before, when the hub named it, when the one before was over, and each node's
timeline: how its trainer started and when it reached each phase), the restarts used, the members lost, where each
member's supervisor listens, and how the job ended; the nodes named slow (trainer.runtime.job.straggler), what each
attempt's trainers spent (trainer.runtime.job.pace), the job's goodput (trainer.runtime.job.goodput) and every change
of its world size (nodes that left it, no spare taking their ranks; nodes that joined it again). Its ``version``
grows with every change and its ``term`` with every new hub, so ``newer_than`` orders any two records of a job; a hub
that takes over carries on from the newest a member kept.

A record is read from the watch and from a node's state.json only through ``JobRecord.read`` (trainer.runtime.schema:
exactly these fields, each of its type): a malformed one is refused, never adopted. Everything else reads its fields.

Phases of an attempt:
    running   every assigned member runs its trainer;
    stopping  a failure was named (``first_failure``): every assigned member stops its trainer;
    waiting   for a lost node to come back, or for a majority of members (``waiting`` says which);
    ended     ``end`` says how.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from trainer.runtime import schema
from trainer.runtime.job.pace import Effort
from trainer.runtime.schema import JsonObject

SCHEMA = 5  # 3: world_changes; 4: joins (WorldChange.joined, Kind.JOINED); 5: Goodput.world_change_s
# The record every node makes from the plan before it hears a hub (trainer.runtime.job.hub.new_record).
LAUNCH_VERSION = 1


class Phase(StrEnum):
    RUNNING = "running"
    STOPPING = "stopping"
    WAITING = "waiting"
    ENDED = "ended"


class EndState(StrEnum):
    FINISHED = "finished"
    FAILED = "failed"
    STOPPED = "stopped"


class Kind(StrEnum):
    """Failure kinds, as the node that saw them names them (trainer.runtime.job.verdict says what each means)."""

    REJECTED = "rejected"
    STOPPED = "stopped"
    PREEMPTED = "preempted"
    KILLED = "killed"
    FROZEN = "frozen"
    HUNG = "hung"
    LOST = "lost"
    EXITED = "exited"
    SLOW = "slow"  # named a straggler and swapped for a spare (trainer.runtime.job.straggler): not a failure of its own
    PARKED = "parked"
    # Not a failure: the attempt before ended because nodes joined its world (trainer.runtime.job.policy.grow).
    JOINED = "joined"


class RecordError(schema.SchemaError):
    """A record that does not follow this schema (from a bad peer, or another version of the runtime)."""


@dataclass(frozen=True)
class Failure:
    """A failure of one node in an attempt: ``at`` the wall-clock time of the failed part's last sign of life, ``rc``
    the trainer's exit status when it has one."""

    node: str
    kind: Kind
    reason: str
    at: float
    rc: int | None = None


@dataclass(frozen=True)
class Cause(Failure):
    """The failure that ended an attempt, as the next attempt records it: when the hub named it (``detected_at``,
    ``detect_s`` after ``at``) and the last step rank 0 had reported then (``failed_step``)."""

    detected_at: float = 0.0
    detect_s: float = 0.0
    failed_step: int | None = None


class Start(StrEnum):
    """How a node's trainer came to an attempt (trainer.runtime.host.node)."""

    PROCESS = "process"  # a new trainer process
    STANDBY = "standby"  # the node's standby process, which had done its imports before the attempt needed it
    IN_PLACE = "in place"  # the process that trained the attempt before: its group torn down and formed again


@dataclass(frozen=True)
class NodeTimeline:
    """One node's trainer in one attempt: how it started, why not in place when it ran the attempt before, the
    wall-clock time each phase was reached by every training process of the node (trainer.runtime.host.channel.PHASES;
    None: not yet), how many micro-batches make its optimizer step (the global batch kept in a smaller world), and,
    when its processes went on in place, their last step before: the attempt's pause on the node is first_step less
    that."""

    start: Start
    fallback: str  # why the node's trainer of the attempt before did not go on in place ("" when it did, or none ran)
    started: float  # the supervisor started the process, or handed it the attempt
    imported: float | None
    group: float | None
    checkpoint: float | None
    first_step: float | None
    killed: str = ""  # why its trainer had to be killed after the stop grace ("" when it stopped or parked in time)
    flight: tuple[str, ...] = ()  # the flight recorder's dumps of the attempt on the node (nccl)
    micro_batches: int | None = None  # of each optimizer step, as its processes said (None: not yet)
    step_before: float | None = None  # its processes' last optimizer step before this attempt (in place; else None)


@dataclass(frozen=True)
class Attempt:
    attempt: int
    started_at: float  # wall clock: the hub's decision to start it
    assignment: dict[str, int]  # node -> node rank
    rendezvous: str
    cause: Cause | None  # what ended the attempt before (None: the launch)
    stopped_at: float | None  # the attempt before was over on every node (its trainers exited or parked)
    nodes: dict[str, NodeTimeline]  # node -> its trainer's timeline in this attempt, as its member reported it


@dataclass(frozen=True)
class End:
    state: EndState
    reason: str
    first_failure: Failure | None


@dataclass(frozen=True)
class Straggler:
    """A node the hub named slow (trainer.runtime.job.straggler); it is never chosen again for this job once swapped or
    dropped."""

    named_at: float  # wall clock
    pace: float  # its time per step against the median of the other nodes', when named
    slow_for: float  # seconds it had been slow then
    replaced_by: str  # the spare that took its rank ("" while it trains on, or once dropped)
    replaced_at: float | None  # wall clock: the hub asked for the swap (or the drop: straggler action drop)
    note: str  # why it trains on ("" once replaced)


@dataclass(frozen=True)
class WorldChange:
    """The world of an attempt of another size than the one before (trainer.runtime.job.policy): smaller when nodes
    left it, no spare taking their ranks; larger again when nodes joined it (a lost node back, a spare free) while it
    was smaller than the launch's. The trainer keeps the global batch in either."""

    attempt: int  # the attempt that starts with the new world
    at: float  # wall clock: the hub's decision
    left: tuple[str, ...]  # the nodes that left (in their old rank order)
    before: int  # nodes in the attempt before
    after: int  # nodes in this attempt
    cause: Kind  # why: lost, or slow (a straggler dropped) when nodes left; joined when nodes joined
    joined: tuple[str, ...] = ()  # the nodes that joined (in their new rank order)


@dataclass(frozen=True)
class Spent:
    """What an ended attempt's trainers spent (trainer.runtime.job.pace), as its slowest node last reported."""

    attempt: int
    effort: Effort


@dataclass(frozen=True)
class Goodput:
    """The job's time from its launch (trainer.runtime.job.goodput): what advanced training, and what was lost where;
    the parts add up to ``wall_s``."""

    wall_s: float
    trained_s: float  # optimizer steps that count (computing, and the all-reduce waits of those steps)
    startup_s: float  # the launch to the first attempt's first batch
    detection_s: float  # failures' last signs of life to the hub naming them
    restart_s: float  # the hub naming a failure to the next attempt's first batch
    recomputed_s: float  # steps trained again: after the checkpoint the next attempt resumed from
    checkpoint_s: float  # steps stalled by checkpoints
    data_s: float  # steps waiting for data
    other_s: float  # the rest: evaluation, epoch ends, steps not yet reported when a failure came
    failures: int  # unplanned interruptions (not preemptions, user stops or swaps)
    checkpoint_every_s: float  # the configured interval (CHECKPOINT_MINUTES; 0: epoch ends only)
    young_daly_s: float | None  # the interval that loses least at the measured checkpoint cost and failure rate
    suggestion: str  # "" unless the configured interval is far from it
    world_change_s: float = 0.0  # of restart_s: the restarts into a world of another size (record.world_changes)


@dataclass(frozen=True)
class JobRecord:
    schema: int
    version: int
    job: str
    term: int  # the hub's term: member ``term mod M`` is the hub (trainer.runtime.watch.succession)
    hub: str
    attempt: int
    phase: Phase
    assignment: dict[str, int]  # node -> node rank, this attempt
    rendezvous: str  # tcp://host:port of this attempt
    world_urls: tuple[str, ...]  # the attempt's nodes' addresses in node-rank order (DDP_CONFIG.WOLRD_URLS)
    directory: dict[str, str]  # node -> where its supervisor listens (host:port)
    restarts: int
    max_restarts: int
    lost: dict[str, str]  # node -> why it is lost
    attempts: tuple[Attempt, ...]
    first_failure: Failure | None  # the failure that stops this attempt (stopping, waiting)
    detected_at: float | None  # when the hub named it (wall clock)
    failed_step: int | None  # the last step rank 0 had reported then
    waiting: str  # what the attempt waits for (waiting)
    end: End | None
    stragglers: dict[str, Straggler]  # node -> when it was named slow, and whether a spare replaced it
    spent: tuple[Spent, ...]  # the ended attempts' efforts
    goodput: Goodput | None  # as of the last attempt's start, or the end
    world_changes: tuple[WorldChange, ...] = ()  # every attempt that started on more or fewer nodes

    def __post_init__(self) -> None:
        if self.schema != SCHEMA:
            raise RecordError(f"schema {self.schema}, this runtime reads schema {SCHEMA}")

    @classmethod
    def read(cls, data: Any, where: str = "record") -> JobRecord:
        """A record from decoded JSON, or RecordError naming the fault."""
        return schema.parse(cls, data, where, RecordError)

    def to_json(self) -> dict[str, Any]:
        return typing.cast(dict[str, Any], schema.dump(self))

    def from_launch(self) -> bool:
        """The record as every node makes it from the plan, before it hears a hub: no hub learns anything from it."""
        return (self.term, self.version) == (0, LAUNCH_VERSION)

    def newer_than(self, other: JobRecord) -> bool:
        """A later hub's term first, then the version."""
        return (self.term, self.version) > (other.term, other.version)

    def changed(self, **fields: Any) -> JobRecord:
        """The next version of the record, with these fields changed."""
        return dataclasses.replace(self, version=self.version + 1, **fields)

    def rank_of(self, node: str) -> int | None:
        return self.assignment.get(node)

    @property
    def rank0(self) -> str | None:
        """The node with rank 0 in this attempt."""
        return next((node for node, rank in self.assignment.items() if rank == 0), None)

    @property
    def cause(self) -> Cause | None:
        """What ended the attempt before this one (None for the launch's attempt)."""
        return self.attempts[-1].cause if self.attempts else None

    @property
    def ended(self) -> bool:
        return self.end is not None


# The record's fields that a delta (``Changes``) carries whole when they changed: all but the job's identity (a hub of
# another term, or another job, sends the whole record) and the per-member tables, which go entry by entry.
FIELDS = tuple(f.name for f in dataclasses.fields(JobRecord)
               if f.name not in ("schema", "version", "job", "term", "directory", "attempts"))


@dataclass(frozen=True)
class Changes:
    """A record as the changes to an earlier version of it of the same hub: members' new or changed addresses, their
    timelines in the newest attempt, the attempts started since, and the record's other fields that changed (each as
    it is now). Members' own entries come in one by one from every member (the launch's joins, every attempt's
    start); a failure named, a member lost, an attempt started, the end change a few fields and add one attempt: sent
    so, a change costs the hub and each member what changed, not the whole record."""

    term: int
    base: int  # the version they apply to
    version: int  # the version they make
    directory: dict[str, str]  # entries new or changed since ``base``
    timelines: dict[str, NodeTimeline]  # the newest attempt's entries new or changed since ``base`` (one it held)
    attempts: tuple[Attempt, ...]  # attempts started since ``base``, whole
    fields: JsonObject  # FIELDS changed since ``base``: their values now (typed by ``read_fields`` at the door)


def read_fields(data: Any, where: str) -> dict[str, Any]:
    """A delta's changed fields, each checked as the record's own, or RecordError naming the fault."""
    return schema.parse_some(JobRecord, data, FIELDS, where, RecordError)


@dataclass(frozen=True)
class Step:
    """What one change of the record (from the version answered before to the next one answered) touched."""

    directory: frozenset[str]  # nodes whose address is new or changed
    timelines: frozenset[str]  # nodes whose timeline in the newest attempt is new or changed
    attempts: int  # attempts added
    fields: frozenset[str]  # FIELDS changed


def step(old: JobRecord, new: JobRecord) -> Step | None:
    """What changed from ``old`` to ``new``, when ``Changes`` can carry it: None when the term or the job differ, an
    address went, an attempt before the newest changed, or the newest changed and another came after it."""
    if (old.term, old.job) != (new.term, new.job) or not old.attempts:
        return None
    if not old.directory.keys() <= new.directory.keys():
        return None
    held = len(old.attempts)
    if len(new.attempts) < held or new.attempts[:held - 1] != old.attempts[:held - 1]:
        return None
    was, now = old.attempts[-1], new.attempts[held - 1]
    if not was.nodes.keys() <= now.nodes.keys() or dataclasses.replace(was, nodes=now.nodes) != now:
        return None
    timelines = frozenset(k for k, v in now.nodes.items() if was.nodes.get(k) != v)
    if timelines and len(new.attempts) > held:
        return None
    return Step(directory=frozenset(k for k, v in new.directory.items() if old.directory.get(k) != v),
                timelines=timelines, attempts=len(new.attempts) - held,
                fields=frozenset(name for name in FIELDS if getattr(old, name) != getattr(new, name)))


def changes_from(record: JobRecord, base: int, steps: list[Step]) -> Changes | None:
    """The changes from version ``base`` to ``record``, made by ``steps`` (in order); None when the newest attempt's
    timelines changed before another attempt started (the member's copy of that attempt would stay stale)."""
    directory: set[str] = set()
    timelines: set[str] = set()
    fields: set[str] = set()
    added = 0
    for s in steps:
        if s.attempts and timelines:
            return None
        added += s.attempts
        directory |= s.directory
        fields |= s.fields
        if not added:  # once an attempt is added, the attempts go whole
            timelines |= s.timelines
    nodes = record.attempts[-1].nodes
    return Changes(term=record.term, base=base, version=record.version,
                   directory={n: record.directory[n] for n in directory}, timelines={n: nodes[n] for n in timelines},
                   attempts=record.attempts[len(record.attempts) - added:] if added else (),
                   fields={name: getattr(record, name) for name in fields})


def with_changes(record: JobRecord, changes: Changes | None) -> JobRecord | None:
    """``record`` with ``changes`` applied, when they apply to it (its term and version); else None."""
    if changes is None or (record.term, record.version) != (changes.term, changes.base) or not record.attempts:
        return None
    *before, last = (*record.attempts, *changes.attempts)
    return dataclasses.replace(record, **changes.fields, version=changes.version,
                               directory={**record.directory, **changes.directory},
                               attempts=(*before, dataclasses.replace(last, nodes={**last.nodes, **changes.timelines})))
