"""The supervisor that hosts the job's hub (trainer.runtime.hub): it answers members with the record, feeds the hub
its own member's reports and the time, keeps the hub's picture in watch.json, and knows when every member has heard
the job's end (then the hub's supervisor may leave).
"""

from __future__ import annotations

from collections.abc import Mapping

from trainer.runtime.hub import Hub
from trainer.runtime.messages import RecordReply, Report, Says
from trainer.runtime.schema import JsonObject


class HubHost:
    def __init__(self, hub: Hub) -> None:
        self.hub = hub
        self.acked: dict[str, int] = {}  # member -> the record version it last said it holds

    def answer(self, node: str, report: Report, now: float) -> tuple[RecordReply, bool]:
        """A member's join or report: the hub learns from it; the member gets the record. Also whether the member's
        trainer changed since its last report (then the hub should act now)."""
        if report.record is not None:
            self.hub.adopt(report.record)
        view = self.hub.members.get(node)
        before = view.report if view is not None else None
        news = before is None or (before.trainer, before.trouble) != (report.trainer, report.trouble)
        self.hub.heard(node, report, now)
        self.acked[node] = report.version
        return RecordReply(says=Says.RECORD, record=self.hub.record, progress=self.hub.progress), news

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
