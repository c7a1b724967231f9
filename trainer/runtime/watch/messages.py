"""What the supervisors of a job say to each other over the watch (trainer.runtime.watch.wire carries the bodies), and a
node's own state: typed values, each body checked at the door (``read_report``, ``read_reply``; trainer.runtime.schema)
and refused when it does not fit.

A member says (``Report``) ``join`` on a new connection, with the record it holds once it has heard a hub, then
``report`` every ``report_every`` seconds (trainer.runtime.job.timing), and at once when its trainer starts, exits or
fails. The hub answers each with its record (``RecordReply``), or, when the report says the member holds the hub's
record already, with ``unchanged`` and no record, or, when the member holds a recent version, with the ``changes`` since
(trainer.runtime.job.record.Changes): the record names every member, so sending it on every report would cost the hub
members² bytes per report period, and every member the whole record's reading at every change
(trainer.runtime.watch.hubhost). Between a member's reports the hub also pushes what every member must act on at once
(an attempt stopping or started, the job's end: trainer.runtime.watch.hubhost.acted_on) down each link, marked
``pushed``: a running trainer would otherwise hear of a grow, a straggler's swap or a failure elsewhere only at its
member's next report, ``report_every`` later (10 s at the default heartbeat timeout), training on in the old world
meanwhile. The member answers a push with a report at once.
A supervisor that is not the hub answers where the hub is (``NotHub``) and closes the connection.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from trainer.runtime import schema
from trainer.runtime.job.pace import Pace
from trainer.runtime.job.record import Changes, End, JobRecord, Kind, NodeTimeline, read_fields
from trainer.runtime.schema import JsonObject


class Mode(StrEnum):
    """A supervisor's part in the watch."""

    MEMBER = "member"  # reports to the hub
    SEARCHING = "searching"  # lost its hub, looks for the next one (trainer.runtime.watch.succession)
    HUB = "hub"  # keeps the job's record


class TrainerState(StrEnum):
    IDLE = "idle"  # no attempt started here yet
    RUNNING = "running"
    PARKED = "parked"  # out of its attempt, its group torn down: it waits in place for the next (trainer.inplace)
    EXITED = "exited"


class Says(StrEnum):
    JOIN = "join"
    REPORT = "report"
    RECORD = "record"
    UNCHANGED = "unchanged"  # the hub's answer to a member that holds its record already
    CHANGES = "changes"  # the hub's answer to a member with a recent version: what changed since
    NOT_HUB = "not_hub"


@dataclass(frozen=True)
class Trainer:
    """A node's trainer in its latest attempt."""

    attempt: int | None
    state: TrainerState
    rank: int | None
    pid: int | None
    rc: int | None
    started: float | None  # wall clock
    ended: float | None

    @property
    def running(self) -> bool:
        return self.state == TrainerState.RUNNING


IDLE = Trainer(attempt=None, state=TrainerState.IDLE, rank=None, pid=None, rc=None, started=None, ended=None)


# Where a training process is in its step (``Where.phase``): a collective's phase is COLLECTIVE and its name.
DATA, COMPUTE, CHECKPOINT, EVALUATE, STARTING = "data", "compute", "checkpoint", "evaluate", "starting"
VALIDATE = "validate"  # in the validation pass: judged by its batches (trainer.heartbeat.validated), not its steps
COLLECTIVE = "collective:"
UNJUDGED = (STARTING, EVALUATE)  # no step is due in them: a rank there is never hung (trainer.runtime.job.verdict.hung)


@dataclass(frozen=True)
class Where:
    """A training process's progress in its attempt, written by its heartbeat thread beside each beat
    (trainer.heartbeat): monotonic times of its node."""

    step: int  # optimizer steps it took in its attempt
    phase: str  # DATA, COMPUTE, COLLECTIVE + a name, CHECKPOINT, EVALUATE (an epoch's end), VALIDATE, STARTING
    since: float  # it entered the phase
    step_at: float  # its last step (its attempt's start before the first; validating: its last batch)
    step_s: float | None  # its usual step time (None before its second step)


@dataclass(frozen=True)
class RankProgress:
    """A rank's progress as its member reports it to the hub: seconds before the report."""

    rank: int
    step: int
    phase: str
    phase_s: float  # in its phase
    stalled_s: float  # since its step last advanced (validating: since its last batch)
    step_s: float | None

    @property
    def waiting(self) -> bool:
        """It waits in a collective (for the other ranks)."""
        return self.phase.startswith(COLLECTIVE)


@dataclass(frozen=True)
class Trouble:
    """What a node saw go wrong with its trainer in an attempt (frozen, preempted, stopped by a user)."""

    attempt: int
    kind: Kind
    reason: str
    at: float  # wall clock


@dataclass(frozen=True)
class Report:
    """A member to the hub."""

    says: Says  # join (a new connection) or report
    node: str
    term: int  # the hub's term as this member knows it (a join: the term it asks the candidate to be hub of)
    addr: str  # where this member's supervisor listens
    version: int  # the version of the record it holds
    trainer: Trainer
    trouble: Trouble | None
    progress: JsonObject | None  # rank 0's status.json (only the rank-0 node sends it)
    port_offer: int | None  # a free port here: the next attempt's rendezvous if this node gets rank 0
    record: JobRecord | None  # a join: the record this member holds, unless the launch's (joined_with); a hub that
    # took over learns the job from it
    pace: Pace | None  # its trainer's effort in its attempt so far (trainer.runtime.job.pace)
    timeline: NodeTimeline | None  # its trainer's timeline in its attempt (the trainer's attempt)
    ranks: tuple[RankProgress, ...] = ()  # its trainer's ranks' progress in its attempt (the hub finds a hung one)
    standby: bool = False  # a process waits here, its imports done: a standby, or the trainer parked (a world
    # grows only by nodes that have one)

    def __post_init__(self) -> None:
        if self.says not in (Says.JOIN, Says.REPORT):
            raise ValueError(f"a member says join or report, not {self.says}")
        if self.record is not None and self.says != Says.JOIN:
            raise ValueError("a join carries the member's record, a report does not")


def joined_with(says: Says, record: JobRecord) -> JobRecord | None:
    """The record a member's message carries: a join's, unless it is the launch's (every node makes that one from the
    plan, and no hub adopts it: so a launch's joins cost the hub no record to read, whatever the job's size)."""
    return record if says == Says.JOIN and not record.from_launch() else None


@dataclass(frozen=True)
class RecordReply:
    """The hub to a member: its record, or the changes to the member's, or neither (``unchanged``: the member holds
    it already), and the run's progress; ``pushed``: sent unasked, between the member's reports (not an answer)."""

    says: Says
    record: JobRecord | None
    changes: Changes | None
    progress: JsonObject | None
    pushed: bool = False

    def __post_init__(self) -> None:
        carries = {Says.RECORD: (True, False), Says.CHANGES: (False, True), Says.UNCHANGED: (False, False)}
        if self.says not in carries:
            raise ValueError(f"expected record, changes or unchanged, got {self.says}")
        if carries[self.says] != (self.record is not None, self.changes is not None):
            raise ValueError("a record answer carries the record, a changes answer the changes, an unchanged one "
                             "neither")


@dataclass(frozen=True)
class NotHub:
    """A supervisor that is not the hub, to a member: who it thinks the hub is."""

    says: Says
    hub: str
    term: int
    searching: bool  # it has lost its hub too
    addr: str | None  # where that hub listens, if it knows

    def __post_init__(self) -> None:
        if self.says != Says.NOT_HUB:
            raise ValueError(f"expected not_hub, got {self.says}")


Reply = RecordReply | NotHub


def read_report(body: Any) -> Report:
    return schema.parse(Report, body, "the member's message")


def read_reply(body: Any) -> Reply:
    if isinstance(body, dict) and body.get("says") in (Says.RECORD, Says.CHANGES, Says.UNCHANGED):
        reply = schema.parse(RecordReply, body, "the answer")
        if reply.changes is None:
            return reply
        fields = read_fields(reply.changes.fields, "the answer: changes: fields")
        return dataclasses.replace(reply, changes=dataclasses.replace(reply.changes, fields=fields))
    return schema.parse(NotHub, body, "the answer")


@dataclass(frozen=True)
class NodeState:
    """A node's part of the job as its supervisor last wrote it (state.json): read by the node's verbs."""

    pid: int
    node: str
    mode: Mode
    term: int
    addr: str
    trainer: Trainer
    record: JobRecord
    progress: JsonObject | None
    end: End | None
    updated: float

    @classmethod
    def read(cls, data: Any, where: str) -> NodeState:
        return schema.parse(cls, data, where)
