"""The supervisor that hosts the job's hub (trainer.runtime.hub): it answers members with the record, feeds the hub
its own member's reports and the time, keeps the hub's picture in watch.json, and knows when every member has heard
the job's end (then the hub's supervisor may leave).

The record names every member, so it is sent only to a member that lacks it: a member that holds the current version
is answered ``unchanged``; one whose version differs from the current one only by members' addresses and timelines
(the launch's joins, an attempt's start: changes that come in one by one from every member) gets those changes; any
other gets the whole record (a join; after any other change: a new attempt, a failure, a lost member). So a report
period costs the hub bytes in proportion to the members, not to their square.
"""

from __future__ import annotations

from collections.abc import Mapping

from trainer.runtime.hub import Hub
from trainer.runtime.messages import RecordReply, Report, Says
from trainer.runtime.record import Changes, JobRecord, members_changes
from trainer.runtime.schema import JsonObject


class HubHost:
    def __init__(self, hub: Hub) -> None:
        self.hub = hub
        self.acked: dict[str, int] = {}  # member -> the record version it last said it holds
        # The versions answered since the record's last change of another kind than members' addresses and timelines
        # (``since``), each with the nodes whose entries it changed: a member holding one of them gets the changes.
        self.seen = hub.record
        self.since = hub.record.version
        self.log: list[tuple[int, frozenset[str], frozenset[str]]] = []
        self.changes: dict[int, Changes] = {}  # base version -> the changes from it to the current version

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
        changes = self.changes.get(report.version) or self.changes.setdefault(
            report.version, self.changes_since(record, report.version))
        return RecordReply(says=Says.CHANGES, record=None, changes=changes, progress=progress)

    def observe(self) -> JobRecord:
        """The hub's record, its change since the last one answered logged."""
        record = self.hub.record
        if record is not self.seen:
            found = members_changes(self.seen, record)
            if found is None:
                self.since, self.log = record.version, []
            else:
                self.log.append((record.version, *found))
            self.seen, self.changes = record, {}
        return record

    def changes_since(self, record: JobRecord, base: int) -> Changes:
        addresses: set[str] = set()
        timelines: set[str] = set()
        for version, moved, phases in reversed(self.log):
            if version <= base:
                break
            addresses |= moved
            timelines |= phases
        nodes = record.attempts[-1].nodes
        return Changes(term=record.term, base=base, version=record.version,
                       directory={n: record.directory[n] for n in addresses},
                       timelines={n: nodes[n] for n in timelines})

    def tick(self, own: Report, now: float, wall: float) -> None:
        """A moment passes; ``own``: this node's own member's report."""
        self.hub.heard(own.node, own, now)
        self.hub.tick(now, wall)

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
