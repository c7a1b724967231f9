"""The supervisor that hosts the job's hub (trainer.runtime.job.hub): it answers members with the record, feeds the hub
its own member's reports and the time, keeps the hub's picture in watch.json, and knows when every member has heard
the job's end (then the hub's supervisor may leave).

The record names every member, so it is sent only to a member that lacks it: a member that holds the current version
is answered ``unchanged``; one that holds a recent version of this hub's record (one of the last ``KEPT_PER_MEMBER``
per member answered) gets the changes since (trainer.runtime.job.record.Changes: members' addresses and timelines, the
attempts started, the fields changed); any other gets the whole record (a join, a member far behind, a hub that took
over). So a report period costs the hub bytes in proportion to the members, not to their square, and a failure or an
attempt costs each member what changed, not the whole record's reading.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from trainer.runtime.job.hub import Hub
from trainer.runtime.job.record import Changes, JobRecord, Step, changes_from, step
from trainer.runtime.schema import JsonObject
from trainer.runtime.watch.messages import RecordReply, Report, Says

KEPT_PER_MEMBER = 4  # versions answered, per member, whose changes to the current one the hub can still send


def acted_on(record: JobRecord) -> tuple[object, ...]:
    """What every member acts on at once (its trainer stops, starts or goes on in place): the phase, the attempt, the
    end. The rest (addresses, timelines, the run's progress) waits for the member's next report."""
    return record.phase, len(record.attempts), record.end


class HubHost:
    def __init__(self, hub: Hub) -> None:
        self.hub = hub
        self.acked: dict[str, int] = {}  # member -> the record version it last said it holds
        # The versions answered since ``since``, each with what it changed: a member holding one of them, or ``since``,
        # gets the changes (at most KEPT_PER_MEMBER per member are kept: the launch's joins alone make one each).
        self.seen = hub.record
        self.since = hub.record.version
        self.log: list[tuple[int, Step]] = []
        self.kept = KEPT_PER_MEMBER * len(hub.plan.members)
        self.changes: dict[int, Changes | None] = {}  # base version -> the changes from it to the current version

    def answer(self, node: str, report: Report, now: float) -> tuple[RecordReply, bool]:
        """A member's join or report: the hub learns from it; the member gets the record, or ``unchanged`` when its
        report says it holds this very record (a join always gets it). Also whether the member's trainer changed
        since its last report (then the hub should act now)."""
        if report.record is not None:
            self.hub.adopt(report.record)
        view = self.hub.members.get(node)
        before = view.report if view is not None else None
        news = before is None or (before.trainer, before.trouble) != (report.trainer, report.trouble)
        self.hub.heard(node, report, now)
        self.acked[node] = report.version
        return self.reply(report), news

    def reply(self, report: Report) -> RecordReply:
        """The record, the changes to the member's version of it, or ``unchanged`` (see the module docstring)."""
        record, progress = self.observe(), self.hub.progress
        held = report.version
        if report.says != Says.REPORT or report.term != record.term or not self.since <= held <= record.version:
            return RecordReply(says=Says.RECORD, record=record, changes=None, progress=progress)
        if report.version == record.version:
            return RecordReply(says=Says.UNCHANGED, record=None, changes=None, progress=progress)
        if held not in self.changes:
            self.changes[held] = self.changes_since(record, held)
        changes = self.changes[held]
        if changes is None:
            return RecordReply(says=Says.RECORD, record=record, changes=None, progress=progress)
        return RecordReply(says=Says.CHANGES, record=None, changes=changes, progress=progress)

    def observe(self) -> JobRecord:
        """The hub's record, its change since the last one answered logged."""
        record = self.hub.record
        if record is not self.seen:
            found = step(self.seen, record)
            if found is None:
                self.since, self.log = record.version, []
            else:
                self.log.append((record.version, found))
                if len(self.log) > self.kept:
                    self.since = self.log.pop(0)[0]
            self.seen, self.changes = record, {}
        return record

    def changes_since(self, record: JobRecord, base: int) -> Changes | None:
        """The changes from version ``base`` (``since``, or one answered since) to ``record``; None: send it whole."""
        steps: list[Step] = []
        for version, change in reversed(self.log):
            if version <= base:
                if version < base:
                    return None  # a version never answered
                break
            steps.append(change)
        else:
            if base != self.since:
                return None
        return changes_from(record, base, steps[::-1])

    def push(self, node: str) -> RecordReply | None:
        """What the hub pushes to ``node`` between its reports (a stop, an attempt, the end): the reply its last
        report would get now, marked pushed; None when it holds this record already, or has not reported yet."""
        view = self.hub.members.get(node)
        if view is None or view.report is None:
            return None
        reply = self.reply(view.report)
        return None if reply.says == Says.UNCHANGED else dataclasses.replace(reply, pushed=True)

    def tick(self, own: Report, now: float, wall: float) -> bool:
        """A moment passes; ``own``: this node's own member's report. Whether the record now has news every member
        must act on at once (an attempt stopping, an attempt started, the job's end): the listener pushes it down every
        link."""
        before = self.hub.record
        self.hub.heard(own.node, own, now)
        self.hub.tick(now, wall)
        return acted_on(before) != acted_on(self.hub.record)

    def members_know_end(self, now: float) -> bool:
        """Every member still heard has the record that ends the job (the hub stays until then, or until the others
        fall silent)."""
        version = self.hub.record.version
        return not [name for name, view in self.hub.members.items() if name != self.hub.plan.node
                    and view.heard is not None and now - view.heard < self.hub.timings.loss
                    and self.acked.get(name, 0) < version]

    def snapshot(self, now: float, wall: float, joins: Mapping[str, int], refused: Mapping[str, int],
                 addr: str) -> JsonObject:
        """watch.json: the hub's picture, the connections each member opened, the refusals, where it listens."""
        picture = self.hub.snapshot(now, wall)
        for name, member in picture["members"].items():
            member["links"] = joins.get(name, 0)
        return {**picture, "record": self.hub.record.to_json(), "progress": self.hub.progress,
                "refused": dict(refused), "addr": addr}
