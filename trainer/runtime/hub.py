"""The job's hub: one member of the job keeps the job's record and makes every decision about its attempts.

Pure state: the supervisor feeds it the members' reports (``heard``) and the passing of time (``tick``), and sends
``record`` back to every member, which starts or stops its trainer to match (trainer.runtime.node). No sockets,
no processes, no clock of its own: unit tests drive it directly.

The record (``new_record``) is the job as the members know it: the attempt and its phase, which member has which
node rank, the attempt's rendezvous, every attempt so far, the restarts used, lost members, where each member's
supervisor listens, and how the job ended. Its ``version`` grows with every change; members persist the newest they
heard, so a new hub (after the hub's node was lost) carries on from it.

Phases of an attempt:
    running   every assigned member runs its trainer. All exit 0: the job finished. A failure (a trainer's bad exit,
              a frozen trainer, a member silent for the heartbeat timeout): after a short settling time the hub names
              the first failure (trainer.runtime.verdict) and stops the attempt;
    stopping  every assigned member stops its trainer; one that does not confirm within the grace time is lost.
              Then the policy (trainer.runtime.policy) ends the job, restarts it, or waits;
    waiting   for a lost node to come back (no spare), or for a majority of members to start the next attempt;
    ended     ``record["end"]`` says how.

An attempt starts only while a majority of the job's members (trainers and spares) have been heard within half the
heartbeat timeout: two groups of nodes cut off from each other can never both train (see trainer.runtime.supervisor).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from trainer.runtime import layout
from trainer.runtime.plan import NodePlan
from trainer.runtime.policy import decide
from trainer.runtime.verdict import exit_failure, failure, first_failure, words

Log = Callable[[str], None]



def world_urls(plan: NodePlan, assignment: Mapping[str, int]) -> list[str]:
    """The cluster addresses of the attempt's nodes in node-rank order (DDP_CONFIG.WOLRD_URLS)."""
    ips = {m.name: m.ip for m in plan.members}
    return [ips[node] for node, _ in sorted(assignment.items(), key=lambda item: item[1])]


def new_record(plan: NodePlan, wall: float) -> dict[str, Any]:
    """The record of a job's launch: attempt 0 with the plan's ranks and rendezvous."""
    assignment = {m.name: m.rank for m in plan.trainers}
    root = plan.trainers[0]
    rendezvous = f"tcp://{layout.url_host(root.ip)}:{plan.port}"
    urls = world_urls(plan, assignment)
    return {
        "version": 1, "job": plan.job, "term": 0, "hub": plan.members[0].name, "attempt": 0, "phase": "running",
        "assignment": assignment, "rendezvous": rendezvous, "world_urls": urls, "directory": {}, "restarts": 0,
        "lost": {}, "end": None,
        "attempts": [{"attempt": 0, "started_at": wall, "assignment": assignment, "rendezvous": rendezvous}],
    }


@dataclass
class MemberView:
    """What the hub knows of a member: when it last heard from it and what it said."""

    name: str
    heard: float | None = None  # monotonic
    report: dict[str, Any] = field(default_factory=dict)

    def trainer(self, attempt: int) -> dict[str, Any]:
        """The member's trainer in this attempt (an empty dict when it has not run it)."""
        trainer = self.report.get("trainer") or {}
        return trainer if trainer.get("attempt") == attempt else {}

    def running(self) -> bool:
        return (self.report.get("trainer") or {}).get("state") == "running"


class Hub:
    def __init__(self, plan: NodePlan, record: Mapping[str, Any], term: int, now: float, wall: float,
                 log: Log, lost_hub: str | None = None) -> None:
        """``lost_hub``: set when this hub takes over from one its members lost (its node counts as lost at once)."""
        self.plan = plan
        self.watch = plan.watch
        self.log = log
        self.record: dict[str, Any] = copy.deepcopy(dict(record))
        self.members = {m.name: MemberView(m.name) for m in plan.members}
        self.started = now  # monotonic: joining and the settling of a new hub are measured from here
        # Members join a launch's hub as their nodes start; a hub that took over waits a heartbeat timeout at most.
        self.join_timeout = plan.watch.startup_timeout if lost_hub is None else plan.watch.heartbeat_timeout
        self.failures: list[dict[str, Any]] = []  # of the current attempt
        self.first_seen: float | None = None
        self.phase_since = now
        self.wait_until: float | None = None  # the policy's wait for lost nodes ends then
        self.majority_until: float | None = None  # the wait for a majority of members ends then
        self.lost_at = {node: now for node in self.record["lost"]}
        self.progress: dict[str, Any] | None = None  # the rank-0 trainer's status, as its member reported it
        self.took_over = lost_hub is not None
        self.base = (self.record.get("term", 0), self.record.get("version", 0))  # the newest record adopted so far
        self.acted = False  # has this hub changed the job (an attempt, an end)? Then it adopts no other record.
        self._change(term=term, hub=plan.node)
        if lost_hub is not None and lost_hub != plan.node:
            timeout = plan.watch.heartbeat_timeout
            why = f"the job's hub there stopped answering (nothing heard for {timeout:.0f} s)"
            self.lost_at[lost_hub] = now
            self._change(lost={**self.record["lost"], lost_hub: why})
            if self.record["phase"] in ("running", "stopping"):
                self._fail(lost_hub, "lost", why, wall - timeout)

    # -- inputs --------------------------------------------------------------------------------------------------

    def heard(self, node: str, report: Mapping[str, Any], now: float) -> None:
        """A member's report (the hub's own member's too)."""
        view = self.members.get(node)
        if view is None:
            return
        view.heard, view.report = now, dict(report)
        if report.get("addr") and self.record["directory"].get(node) != report["addr"]:
            self._change(directory={**self.record["directory"], node: report["addr"]})
        rank0 = next((n for n, r in self.record["assignment"].items() if r == 0), None)
        if node == rank0 and report.get("progress") is not None:
            self.progress = report["progress"]

    def adopt(self, record: Mapping[str, Any]) -> None:
        """A newer record of the job from a joining member: a hub that took over learns the job from its members,
        until it acts on the job itself."""
        theirs = (record.get("term", 0), record.get("version", 0))
        if self.acted or theirs <= self.base or record.get("job") != self.record["job"]:
            return
        self.base = theirs
        term, hub, lost = self.record["term"], self.record["hub"], self.record["lost"]
        self.record = copy.deepcopy(dict(record))
        self._change(term=term, hub=hub, lost={**self.record["lost"], **lost})

    def tick(self, now: float, wall: float) -> None:
        if self.record["end"] is not None:
            return
        self._welcome_back(now)
        phase = self.record["phase"]
        if phase == "running":
            self._check_running(now, wall)
        elif phase == "stopping":
            self._check_stopping(now, wall)
        elif phase == "waiting":
            self._check_waiting(now, wall)

    # -- what the hub knows ----------------------------------------------------------------------------------------

    def quorum(self, now: float) -> tuple[int, int]:
        """(members heard within half the heartbeat timeout, members needed for a majority)."""
        lease = self.watch.heartbeat_timeout / 2
        fresh = sum(1 for v in self.members.values()
                    if v.name == self.plan.node or (v.heard is not None and now - v.heard <= lease))
        return fresh, len(self.members) // 2 + 1

    def has_quorum(self, now: float) -> bool:
        fresh, needed = self.quorum(now)
        return fresh >= needed

    def first(self) -> dict[str, Any] | None:
        return first_failure(self.failures)

    def snapshot(self, now: float) -> dict[str, Any]:
        """The hub's picture for watch.json and the follow."""
        fresh, needed = self.quorum(now)
        members = {}
        for name, view in self.members.items():
            trainer = view.report.get("trainer") or {}
            members[name] = {"heard_ago": None if view.heard is None else round(now - view.heard, 1),
                             "trainer": trainer.get("state", "none"), "attempt": trainer.get("attempt"),
                             "rank": self.record["assignment"].get(name)}
        return {"record": self.record, "members": members, "progress": self.progress, "failures": self.failures,
                "first_failure": self.first(), "quorum": {"fresh": fresh, "needed": needed},
                "lease": self.watch.heartbeat_timeout / 2}

    # -- running ---------------------------------------------------------------------------------------------------

    def _fail(self, node: str, kind: str, reason: str, at: float, rc: int | None = None) -> None:
        if not any(f["node"] == node for f in self.failures):
            self.failures.append(failure(node, kind, reason, at, rc))
            self.log(f"{node}: {reason}")

    def _silent(self, view: MemberView, now: float) -> str | None:
        """Why a member counts as lost, or None."""
        timeout = self.watch.heartbeat_timeout
        if view.heard is None:
            if now - self.started > self.join_timeout:
                return f"it never joined the job's watch within {self.join_timeout:.0f} s"
            return None
        if now - view.heard > timeout:
            return f"it stopped answering the hub (nothing heard for {timeout:.0f} s)"
        return None

    def _check_running(self, now: float, wall: float) -> None:
        attempt, finished = self.record["attempt"], []
        joined = all(view.heard is not None for view in self.members.values())
        if not self.has_quorum(now) and (joined or now - self.started > self.join_timeout):
            # Nodes the hub cannot hear may be training without it: stop this attempt before they could start one.
            fresh, needed = self.quorum(now)
            lease = self.watch.heartbeat_timeout / 2
            for name, view in self.members.items():
                if name != self.plan.node and (view.heard is None or now - view.heard > lease):
                    self._fail(name, "lost", f"the hub cannot hear it, nor a majority of the job's members ({fresh} "
                               f"heard, {needed} needed)", wall - (now - (view.heard or self.started)))
        for node in self.record["assignment"]:
            view = self.members[node]
            lost = self._silent(view, now)
            trainer = view.trainer(attempt)
            seen = view.report.get("failure")
            if lost is not None:
                self._fail(node, "lost", lost, wall - (now - (view.heard or self.started)))
            elif seen is not None and seen.get("attempt") == attempt:
                self._fail(node, seen["kind"], seen["reason"], seen["at"], seen.get("rc"))
            elif trainer.get("state") == "exited":
                if trainer.get("rc") == 0:
                    finished.append(node)
                else:
                    self._fail(node, *exit_failure(trainer.get("rc")), trainer.get("ended", wall), trainer.get("rc"))
        if len(finished) == len(self.record["assignment"]):
            self._end("finished", f"attempt {attempt} trained to the end on every node")
            return
        if not self.failures:
            return
        if self.first_seen is None:
            self.first_seen = now
        # A failure's consequences arrive within moments (peers lose their collective): let its cause arrive too.
        if now - self.first_seen >= min(3.0, self.watch.heartbeat_timeout / 6):
            first = self.first()
            assert first is not None
            self.log(f"attempt {attempt}: {words(first)}; stopping the attempt on every node")
            self._change(phase="stopping", first_failure=first, detected_at=wall,
                         failed_step=(self.progress or {}).get("step"))
            self.phase_since = now

    # -- stopping and deciding -------------------------------------------------------------------------------------

    def _check_stopping(self, now: float, wall: float) -> None:
        deadline = self.phase_since + self.watch.stop_grace + min(30.0, self.watch.heartbeat_timeout)
        lost = {**self.record["lost"], **{f["node"]: f["reason"] for f in self.failures if f["kind"] == "lost"}}
        pending = []
        for node in self.record["assignment"]:
            view = self.members[node]
            if node in lost:
                continue
            silent = self._silent(view, now)
            if silent is None and view.running() and now > deadline:
                silent = "it did not confirm that its trainer stopped"
            if silent is not None:
                lost[node] = silent
                # A node lost for good shows first as its peers' exits (their collective broke at once), and only
                # later as silence: one silent since before the first failure is its cause, not a consequence.
                last = wall - (now - (view.heard or self.started))
                if last <= self.record["first_failure"]["at"]:
                    self._fail(node, "lost", silent, last)
            elif view.running():
                pending.append(node)
        if lost != self.record["lost"]:
            self.lost_at.update({node: now for node in lost if node not in self.lost_at})
            self._change(lost=lost)
        first = self.first()
        if first != self.record["first_failure"]:
            assert first is not None
            self.log(f"attempt {self.record['attempt']}: {words(first)}")
            self._change(first_failure=first)
        if not pending:
            self._decide(now, wall)

    def _available(self, now: float) -> list[str]:
        """Members that could join the next attempt: heard recently, not lost, trainer not running."""
        return [m.name for m in self.plan.members
                if m.name not in self.record["lost"] and self._silent(self.members[m.name], now) is None
                and self.members[m.name].heard is not None and not self.members[m.name].running()]

    def _decide(self, now: float, wall: float) -> None:
        attempts = self.record["attempts"]
        previous = attempts[-1].get("cause") if len(attempts) > 1 else None
        assigned_lost = {n: why for n, why in self.record["lost"].items() if n in self.record["assignment"]}
        decision = decide(
            first=self.record["first_failure"], previous=previous, assignment=self.record["assignment"],
            lost=assigned_lost, available=self._available(now), restarts_used=self.record["restarts"],
            max_restarts=self.plan.restarts.max_restarts, waited=self.wait_until is not None and now >= self.wait_until,
            node_wait=self.plan.restarts.node_wait,
        )
        if decision.action == "end":
            self._end(decision.end_state, decision.reason)
        elif decision.action == "wait":
            if self.record["phase"] != "waiting":
                self.log(decision.reason)
                self.wait_until = now + self.plan.restarts.node_wait
                self._change(phase="waiting", waiting=decision.reason)
                self.phase_since = now
        else:
            self._restart(decision.assignment, decision.reason, now, wall)

    def _welcome_back(self, now: float) -> None:
        """Lost members heard again since they were lost, with no trainer running, may take part again."""
        back = [n for n in self.record["lost"] if self._silent(self.members[n], now) is None
                and (self.members[n].heard or 0.0) > self.lost_at.get(n, now) and not self.members[n].running()]
        if back:
            self.log(f"{', '.join(back)} answered again")
            for node in back:
                self.lost_at.pop(node, None)
            self._change(lost={n: why for n, why in self.record["lost"].items() if n not in back})

    def _check_waiting(self, now: float, wall: float) -> None:
        self._decide(now, wall)

    def _restart(self, assignment: dict[str, int], reason: str, now: float, wall: float) -> None:
        if self.took_over and now - self.started < self.watch.stop_grace:
            return  # a hub that took over lets the old attempt's last processes end first (see supervisor)
        if not self.has_quorum(now):
            fresh, needed = self.quorum(now)
            if self.record["phase"] != "waiting" or "majority" not in self.record.get("waiting", ""):
                self.log(f"cannot restart yet: {fresh} of {len(self.members)} members heard, {needed} needed")
                self.majority_until = now + self.plan.restarts.node_wait
                self._change(phase="waiting", waiting=f"a majority of members ({fresh} heard, {needed} needed)")
            elif self.majority_until is not None and now > self.majority_until:
                self._end("failed", f"{reason}; but only {fresh} of the job's {len(self.members)} members could be "
                          f"heard ({needed} needed) for {self.plan.restarts.node_wait:.0f} s")
            return
        rank0 = next(node for node, rank in assignment.items() if rank == 0)
        ip = next(m.ip for m in self.plan.members if m.name == rank0)
        port = self.members[rank0].report.get("port_offer") or self.plan.port
        rendezvous = f"tcp://{layout.url_host(ip)}:{port}"
        urls = world_urls(self.plan, assignment)
        first = self.record["first_failure"]
        attempt = self.record["attempt"] + 1
        cause = {**first, "detected_at": self.record["detected_at"],
                 "detect_s": round(self.record["detected_at"] - first["at"], 1),
                 "failed_step": self.record.get("failed_step")}
        entry = {"attempt": attempt, "started_at": wall, "assignment": assignment, "rendezvous": rendezvous,
                 "cause": cause}
        self.log(f"attempt {attempt}: {reason}")
        self.failures, self.first_seen, self.wait_until, self.majority_until = [], None, None, None
        self.acted = True
        self._change(attempt=attempt, phase="running", assignment=assignment, rendezvous=rendezvous, world_urls=urls,
                     attempts=[*self.record["attempts"], entry], restarts=self.record["restarts"] + 1,
                     first_failure=None, waiting="")
        self.phase_since = now

    def _end(self, state: str, reason: str) -> None:
        self.acted = True
        self.log(f"the job {state}: {reason}")
        self._change(phase="ended", end={"state": state, "reason": reason, "first_failure": self.first()})

    def _change(self, **fields: Any) -> None:
        self.record.update(fields)
        self.record["version"] = self.record.get("version", 0) + 1
