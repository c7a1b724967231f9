"""What the hub hears of the job's members: when each last spoke and what it said, which are silent (lost, or never
joined), whether a majority is heard (the no-split rule: trainer.runtime.job.timing), and which could take a rank. The
job's state machine (trainer.runtime.job.hub) asks; it decides.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainer.runtime.job.record import JobRecord
from trainer.runtime.plan import NodePlan
from trainer.runtime.watch.messages import Report, Trainer


@dataclass
class MemberView:
    """What the hub knows of a member: when it last heard from it and what it said."""

    name: str
    heard: float | None = None  # monotonic
    report: Report | None = None

    def trainer(self, attempt: int) -> Trainer | None:
        """The member's trainer in this attempt (None when it has not run it)."""
        if self.report is None or self.report.trainer.attempt != attempt:
            return None
        return self.report.trainer

    def running(self) -> bool:
        return self.report is not None and self.report.trainer.running


class Roster(dict[str, MemberView]):
    """Every member of the job's plan, by name (in the plan's order), as the hub has heard it."""

    def __init__(self, plan: NodePlan, now: float, join_timeout: float) -> None:
        """``join_timeout``: a member not heard this long after ``now`` (the hub's start) never joined."""
        super().__init__((m.name, MemberView(m.name)) for m in plan.members)
        self.me = plan.node
        self.timings = plan.timings
        self.started = now
        self.join_timeout = join_timeout

    def quorum(self, now: float) -> tuple[int, int]:
        """(members heard within the lease, members needed for a majority)."""
        fresh = sum(1 for v in self.values()
                    if v.name == self.me or (v.heard is not None and now - v.heard <= self.timings.lease))
        return fresh, len(self) // 2 + 1

    def has_quorum(self, now: float) -> bool:
        fresh, needed = self.quorum(now)
        return fresh >= needed

    def joined_or_late(self, now: float) -> bool:
        """Every member has been heard, or the time to join is over."""
        return all(v.heard is not None for v in self.values()) or now - self.started > self.join_timeout

    def silent(self, node: str, now: float) -> str | None:
        """Why a member counts as lost, or None."""
        heard = self[node].heard
        if heard is None:
            if now - self.started > self.join_timeout:
                return f"it never joined the job's watch within {self.join_timeout:.0f} s"
            return None
        if now - heard > self.timings.loss:
            return f"it stopped answering the hub (nothing heard for {self.timings.loss:.0f} s)"
        return None

    def last_sign(self, node: str, now: float, wall: float) -> float:
        """The wall-clock time the hub last heard the member (or started, if it never did)."""
        heard = self[node].heard
        return wall - (now - (heard if heard is not None else self.started))

    def available(self, now: float, record: JobRecord) -> list[str]:
        """Members that could join the next attempt: heard recently, not lost, not named a straggler, trainer not
        running."""
        return [name for name, view in self.items()
                if name not in record.lost and name not in record.stragglers and self.silent(name, now) is None
                and view.heard is not None and not view.running()]
