"""The job's hub: one member of the job keeps the job's record (trainer.runtime.job.record) and makes every decision
about its attempts.

Pure state: the supervisor's hub host (trainer.runtime.watch.hubhost) feeds it the members' reports (``heard``) and the
passing of time (``tick``), and sends ``record`` back to every member, which starts or stops its trainer to match
(trainer.runtime.host.node). No sockets, no processes, no clock of its own: unit tests drive it directly.

Phases of an attempt:
    running   every assigned member runs its trainer. All exit 0: the job finished. A failure (a trainer's bad exit,
              a frozen trainer, a hung rank (its step stopped while the others wait for it in a collective:
              trainer.runtime.job.verdict.hung, from the ranks' progress in the members' reports), a member silent
              for the heartbeat timeout): the hub names the first failure
              (trainer.runtime.job.verdict) and stops the attempt, at once when it is a kill, a freeze, a loss, a bad
              input or a stop, else after a short settling time (its cause may still arrive);
    stopping  every assigned member stops its trainer; one that does not confirm within the grace time is lost (a
              trainer that rejected its input and exits only now, after its peers parked, is named the cause).
              Then, if every trainer exited 0 (the stop, a user's or a preemption, came after the last step), the
              job finished; else the policy (trainer.runtime.job.policy) ends the job, restarts it, or waits;
    waiting   for a lost node to come back (no spare, and too few nodes would be left without it: min_nodes), or for
              a majority of members to start the next attempt;
    ended     ``record.end`` says how.

While an attempt runs the hub also scores every node's pace against the others' (trainer.runtime.job.pace) and names a
node slow for a whole window a straggler: in the record, and, when the rules allow (trainer.runtime.job.straggler),
swapped for a spare: the attempt stops with a checkpoint at a common step and the next one starts with the spare in its
rank, as a lost node is replaced. At each new attempt and at the end it writes the job's goodput
(trainer.runtime.job.goodput).

A world smaller than the launch's (a lost node left it, no spare taking its rank: trainer.runtime.job.policy) grows back
while its attempt runs with nothing failed: once every trainer of the attempt has taken its first step, members free to
take a rank (a lost node that answered again, a spare) join it (trainer.runtime.job.policy.grow; never in a dropped
straggler's place), with restart in place once their standby has done its imports (the world trains on meanwhile).
The next attempt starts at once, with no stopping phase: the nodes' trainers park in place and join it, the joiners
start theirs (trainer.runtime.host.node). A grow is no failure: its attempt's cause is
``joined``, and no restart is counted.

An attempt starts only while a majority of the job's members (trainers and spares) have been heard within the lease
(trainer.runtime.job.timing): two groups of nodes cut off from each other can never both train (see
trainer.runtime.watch.supervisor).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

from trainer.runtime import layout, schema
from trainer.runtime.job import goodput, straggler
from trainer.runtime.job.pace import PaceBook, rounded
from trainer.runtime.job.policy import Action, Decision, decide, grow
from trainer.runtime.job.record import (
    LAUNCH_VERSION,
    SCHEMA,
    Attempt,
    Cause,
    End,
    EndState,
    Failure,
    Goodput,
    JobRecord,
    Kind,
    NodeTimeline,
    Phase,
    Spent,
    WorldChange,
)
from trainer.runtime.job.roster import MemberView, Roster
from trainer.runtime.job.verdict import exit_failure, first_failure, hung, no_consequence, words
from trainer.runtime.plan import NodePlan
from trainer.runtime.schema import JsonObject
from trainer.runtime.watch.messages import Report, TrainerState

Log = Callable[[str], None]


def world_urls(plan: NodePlan, assignment: Mapping[str, int]) -> tuple[str, ...]:
    """The cluster addresses of the attempt's nodes in node-rank order (DDP_CONFIG.WOLRD_URLS)."""
    ips = {m.name: m.ip for m in plan.members}
    return tuple(ips[node] for node, _ in sorted(assignment.items(), key=lambda item: item[1]))


def new_record(plan: NodePlan, wall: float) -> JobRecord:
    """The record of a job's launch: attempt 0 with the plan's ranks and rendezvous."""
    assignment = {m.name: m.rank for m in plan.trainers if m.rank is not None}
    rendezvous = f"tcp://{layout.url_host(plan.trainers[0].ip)}:{plan.port}"
    return JobRecord(
        schema=SCHEMA, version=LAUNCH_VERSION, job=plan.job, term=0, hub=plan.members[0].name, attempt=0,
        phase=Phase.RUNNING, assignment=assignment, rendezvous=rendezvous, world_urls=world_urls(plan, assignment),
        directory={}, restarts=0, max_restarts=plan.restarts.max_restarts, lost={},
        attempts=(Attempt(attempt=0, started_at=wall, assignment=assignment, rendezvous=rendezvous, cause=None,
                          stopped_at=None, nodes={}),),
        first_failure=None, detected_at=None, failed_step=None, waiting="", end=None, stragglers={}, spent=(),
        goodput=None,
    )


class Hub:
    def __init__(self, plan: NodePlan, record: JobRecord, term: int, now: float, wall: float,
                 log: Log, lost_hub: str | None = None) -> None:
        """``lost_hub``: set when this hub takes over from one its members lost (its node counts as lost at once)."""
        self.plan = plan
        self.timings = plan.timings
        self.log = log
        self.record = record
        self.started = now  # monotonic: joining and the settling of a new hub are measured from here
        # Members join a launch's hub as their nodes start; a hub that took over waits less.
        join_timeout = plan.watch.startup_timeout if lost_hub is None else self.timings.takeover_join
        self.members = Roster(plan, now, join_timeout)
        self.failures: list[Failure] = []  # of the current attempt
        self.first_seen: float | None = None
        self.phase_since = now
        self.wait_until: float | None = None  # the policy's wait for lost nodes ends then
        self.majority_until: float | None = None  # the wait for a majority of members ends then
        self.lost_at = {node: now for node in self.record.lost}
        self.progress: JsonObject | None = None  # the rank-0 trainer's status, as its member reported it
        self.stopped_at: float | None = None  # wall clock: every trainer of the stopping attempt had stopped
        self.took_over = lost_hub is not None
        self.acted = False  # has this hub changed the job (an attempt, an end)? Then it adopts no other record.
        self.base = record  # the newest record adopted so far
        self.paces = PaceBook(plan.stragglers.span(self.timings.report_every))
        self.slow = straggler.Watch(plan.stragglers)
        self._change(term=term, hub=plan.node)
        if lost_hub is not None and lost_hub != plan.node:
            why = f"the job's hub there stopped answering (nothing heard for {self.timings.loss:.0f} s)"
            self.lost_at[lost_hub] = now
            self._change(lost={**self.record.lost, lost_hub: why})
            if self.record.phase in (Phase.RUNNING, Phase.STOPPING):
                self._fail(Failure(lost_hub, Kind.LOST, why, wall - self.timings.loss))

    # -- inputs --------------------------------------------------------------------------------------------------

    def heard(self, node: str, report: Report, now: float) -> None:
        """A member's report (the hub's own member's too)."""
        view = self.members.get(node)
        if view is None:
            return
        view.heard, view.report = now, report
        if report.addr and self.record.directory.get(node) != report.addr:
            self._change(directory={**self.record.directory, node: report.addr})
        if node == self.record.rank0 and report.progress is not None:
            self.progress = report.progress
        self.paces.heard(node, report.pace, now)
        if report.timeline is not None and report.trainer.attempt == self.record.attempt:
            self._note_timeline(node, report.timeline)

    def adopt(self, record: JobRecord) -> None:
        """A newer record of the job from a joining member: a hub that took over learns the job from its members,
        until it acts on the job itself. The launch's hub is where every record comes from: a member that joins it
        again (back from a cut) holds an older copy of its own record."""
        if not self.took_over or self.acted or not record.newer_than(self.base) or record.job != self.record.job:
            return
        self.base = record
        mine = self.record
        self.record = dataclasses.replace(record, term=mine.term, hub=mine.hub, lost={**record.lost, **mine.lost},
                                          version=record.version + 1)

    def tick(self, now: float, wall: float) -> None:
        if self.record.end is not None:
            return
        self._welcome_back(now)
        phase = self.record.phase
        if phase == Phase.RUNNING:
            self._check_running(now, wall)
            if self.record.phase == Phase.RUNNING and not self.failures:
                self._check_stragglers(now, wall)
            if self.record.phase == Phase.RUNNING and not self.failures:
                self._check_grow(now, wall)
            if self.record.phase == Phase.STOPPING:  # its trainers may all have stopped already (parked, exited)
                self._check_stopping(now, wall)
        elif phase == Phase.STOPPING:
            self._check_stopping(now, wall)
        elif phase == Phase.WAITING:
            self._decide(now, wall)

    # -- what the hub knows ----------------------------------------------------------------------------------------

    def first(self) -> Failure | None:
        return first_failure(self.failures)

    def snapshot(self, now: float, wall: float) -> JsonObject:
        """The hub's picture for watch.json and the follow: each member, the attempt's failures, the quorum, each
        node's pace, and the job's goodput so far."""
        fresh, needed = self.members.quorum(now)
        paces = rounded(self.paces.paces(self.record.attempt, self.record.assignment))
        members = {}
        for name, view in self.members.items():
            trainer = view.report.trainer if view.report is not None else None
            members[name] = {"heard_ago": None if view.heard is None else round(now - view.heard, 1),
                             "trainer": trainer.state.value if trainer else "none",
                             "attempt": trainer.attempt if trainer else None, "rank": self.record.rank_of(name),
                             "pace": paces.get(name)}
        first = self.first()
        return {"members": members, "failures": [dataclasses.asdict(f) for f in self.failures],
                "first_failure": None if first is None else dataclasses.asdict(first),
                "quorum": {"fresh": fresh, "needed": needed}, "lease": self.timings.lease,
                "goodput": schema.dump(self.goodput_until(wall))}

    def goodput_until(self, wall: float) -> Goodput:
        """The job's goodput up to ``wall`` (as of its end, once it ended)."""
        if self.record.end is not None and self.record.goodput is not None:
            return self.record.goodput
        return goodput.account(self.record, self.paces.effort(self.record.attempt, self.record.assignment), wall)

    # -- running ---------------------------------------------------------------------------------------------------

    def _fail(self, failure: Failure) -> None:
        if not any(f.node == failure.node for f in self.failures):
            self.failures.append(failure)
            self.log(f"{failure.node}: {failure.reason}")

    def _trained_to_the_end(self) -> bool:
        """Every node's trainer of this attempt exited 0: the job trained to the end, whatever was asked of it after
        its last step (a stop or a preemption that came too late to stop anything)."""
        attempt = self.record.attempt
        return all((trainer := self.members[node].trainer(attempt)) is not None
                   and trainer.state == TrainerState.EXITED and trainer.rc == 0 for node in self.record.assignment)

    def _check_running(self, now: float, wall: float) -> None:
        attempt = self.record.attempt
        if self._trained_to_the_end():
            self._end(EndState.FINISHED, f"attempt {attempt} trained to the end on every node", wall)
            return
        if not self.members.has_quorum(now) and self.members.joined_or_late(now):
            # Nodes the hub cannot hear may be training without it: stop this attempt before they could start one.
            fresh, needed = self.members.quorum(now)
            for name, view in self.members.items():
                if name != self.plan.node and (view.heard is None or now - view.heard > self.timings.lease):
                    why = (f"the hub cannot hear it, nor a majority of the job's members ({fresh} heard, {needed} "
                           "needed)")
                    self._fail(Failure(name, Kind.LOST, why, self.members.last_sign(name, now, wall)))
        for node in self.record.assignment:
            view = self.members[node]
            lost = self.members.silent(view.name, now)
            trainer = view.trainer(attempt)
            trouble = view.report.trouble if view.report is not None else None
            if lost is not None:
                self._fail(Failure(node, Kind.LOST, lost, self.members.last_sign(view.name, now, wall)))
            elif trouble is not None and trouble.attempt == attempt:
                self._fail(Failure(node, trouble.kind, trouble.reason, trouble.at))
            elif trainer is not None and trainer.state == TrainerState.EXITED and trainer.rc != 0:
                kind, reason = exit_failure(trainer.rc)
                self._fail(Failure(node, kind, reason, trainer.ended or wall, trainer.rc))
            elif trainer is not None and trainer.state == TrainerState.PARKED:
                self._fail(Failure(node, Kind.PARKED, "its trainer lost its peers and waits in place for the next "
                                   "attempt", trainer.ended or wall))
        if not self.failures:
            self._check_hung(now, wall)
        if not self.failures:
            return
        if self.first_seen is None:
            self.first_seen = now
        # A failure's consequences arrive within moments (peers lose their collective): let its cause arrive too,
        # unless it is one already, or every node of the attempt has failed (nothing is left to arrive).
        first = self.first()
        assert first is not None
        every = {f.node for f in self.failures} >= set(self.record.assignment)
        if now - self.first_seen >= self.timings.settle or every or no_consequence(first):
            self.log(f"attempt {attempt}: {words(first)}; stopping the attempt on every node")
            self._change(phase=Phase.STOPPING, first_failure=first, detected_at=wall,
                         failed_step=_step(self.progress))
            self.phase_since, self.stopped_at = now, None

    def _check_hung(self, now: float, wall: float) -> None:
        """Name a rank whose step stopped while the others wait for it (its node then kills its trainer). Judged only
        on every rank of the attempt, freshly heard: a rank missing (it stopped beating: frozen, which its node names)
        or a member's report gone stale would make a rank that waits for it look like the one that stopped."""
        attempt = self.record.attempt
        ranks = []
        for node in self.record.assignment:
            view = self.members[node]
            trainer = view.trainer(attempt)
            if (trainer is None or not trainer.running or view.report is None or not view.report.ranks
                    or view.heard is None or now - view.heard > 2 * self.timings.report_every):
                return
            ranks.extend((node, rank) for rank in view.report.ranks)
        failure = hung(ranks, self.timings, wall)
        if failure is not None:
            self._fail(failure)

    # -- stragglers --------------------------------------------------------------------------------------------------

    def _check_stragglers(self, now: float, wall: float) -> None:
        """Name the nodes slow for a whole window; swap one for a spare when the rules allow: every node's trainer
        checkpoints at a common step first (trainer.runtime.job.straggler, .node.stop_signal)."""
        paces = self.paces.paces(self.record.attempt, self.record.assignment)
        turn = straggler.turn(self.slow, self.record, paces, next(iter(self._spares(now)), None), self.plan.min_nodes,
                              now, wall)
        for line in turn.said:
            self.log(line)
        if turn.swap is None:
            if turn.stragglers != self.record.stragglers:
                self._change(stragglers=turn.stragglers)
            return
        failure = Failure(turn.swap, Kind.SLOW, straggler.swap_reason(turn.stragglers[turn.swap], self.slow.rules),
                          wall)
        self.failures.append(failure)  # a real failure while the attempt stops is named instead (verdict.TIERS)
        self._change(phase=Phase.STOPPING, first_failure=failure, detected_at=wall, failed_step=_step(self.progress),
                     stragglers=turn.stragglers)
        self.phase_since = now

    def _spares(self, now: float) -> list[str]:
        """Members that could take a rank in the next attempt: available, and not in this one."""
        return [node for node in self.members.available(now, self.record) if node not in self.record.assignment]

    # -- growing -----------------------------------------------------------------------------------------------------

    def _check_grow(self, now: float, wall: float) -> None:
        """Bring a world smaller than the launch's back up with the members free to take a rank, at once. Only once
        every trainer of the attempt runs, has taken its first step in it (one still starting would not park in place)
        and was heard within the lease (a member not heard of late may be going), and with a majority heard (no
        attempt starts without one; a running attempt keeps training meanwhile)."""
        attempt, assignment = self.record.attempt, self.record.assignment
        if not self.members.has_quorum(now):
            return
        timelines = self.record.attempts[-1].nodes
        for node in assignment:
            view = self.members[node]
            trainer = view.trainer(attempt)
            stepped = node in timelines and timelines[node].first_step is not None
            if trainer is None or not trainer.running or not stepped or view.heard is None \
                    or now - view.heard > self.timings.lease:
                return
        # A dropped straggler's rank goes to no spare, then or later (straggler action drop).
        dropped = sum(len(change.left) for change in self.record.world_changes if change.cause == Kind.SLOW)
        decision = grow(assignment, len(self.record.attempts[0].assignment) - dropped, self._joiners(now))
        if decision is not None:
            cause = Cause(decision.joined[0], Kind.JOINED, decision.reason, wall, detected_at=wall,
                          failed_step=_step(self.progress))
            self._restart(decision, cause, now, wall)

    def _joiners(self, now: float) -> list[str]:
        """Members free to join the running attempt. With restart in place, only those where a process waits with
        its imports done (a standby, or the trainer parked): the attempt's trainers park at the grow, and would
        otherwise wait out the joiner's start (an interpreter, torch, CUDA: seconds to a minute) instead of training
        on until it can join at once."""
        spares = self._spares(now)
        if not self.plan.restarts.in_place:
            return spares
        return [node for node in spares if (report := self.members[node].report) is not None and report.standby]

    # -- stopping and deciding -------------------------------------------------------------------------------------

    def _check_rejected(self, node: str, view: MemberView, wall: float) -> None:
        """A trainer that rejected its input may take longer to exit than its peers to park (their collective broke as
        it began to): no stop makes a trainer exit so, so it is the cause, and no restart follows."""
        trainer = view.trainer(self.record.attempt)
        if trainer is None or trainer.state != TrainerState.EXITED:
            return
        kind, reason = exit_failure(trainer.rc)
        if kind == Kind.REJECTED:
            self._fail(Failure(node, kind, reason, trainer.ended or wall, trainer.rc))

    def _check_stopping(self, now: float, wall: float) -> None:
        deadline = self.phase_since + self.timings.confirm_stop
        lost = {**self.record.lost, **{f.node: f.reason for f in self.failures if f.kind == Kind.LOST}}
        named = self.record.first_failure
        assert named is not None
        pending = []
        for node in self.record.assignment:
            view = self.members[node]
            if node in lost:
                continue
            silent = self.members.silent(view.name, now)
            if silent is None and view.running() and now > deadline:
                silent = "it did not confirm that its trainer stopped"
            if silent is not None:
                lost[node] = silent
                # A node lost for good shows first as its peers' exits (their collective broke at once), and only
                # later as silence: one silent since before the first failure is its cause, not a consequence.
                last = self.members.last_sign(view.name, now, wall)
                if last <= named.at:
                    self._fail(Failure(node, Kind.LOST, silent, last))
            elif view.running():
                pending.append(node)
            else:
                self._check_rejected(node, view, wall)
        if lost != self.record.lost:
            self.lost_at.update({node: now for node in lost if node not in self.lost_at})
            self._change(lost=lost)
        first = self.first()
        if first is not None and first != named:
            # Named now: a lost node's silence outlasts its peers' broken collective, and the time between is the
            # loss's detection, not the restart's (restart_s is measured from detected_at).
            self.log(f"attempt {self.record.attempt}: {words(first)}")
            self._change(first_failure=first, detected_at=wall)
        if not pending:
            if self.stopped_at is None:
                self.stopped_at = wall
            if self._trained_to_the_end():
                self._end(EndState.FINISHED, f"attempt {self.record.attempt} trained to the end on every node "
                          f"before it could stop ({words(first or named)})", wall)
            else:
                self._decide(now, wall)

    def _decide(self, now: float, wall: float) -> None:
        record = self.record
        assert record.first_failure is not None
        decision = decide(
            first=record.first_failure, previous=record.cause,
            assignment=record.assignment, lost={n: why for n, why in record.lost.items() if n in record.assignment},
            available=self.members.available(now, record), restarts_used=record.restarts,
            max_restarts=record.max_restarts,
            waited=self.wait_until is not None and now >= self.wait_until, node_wait=self.plan.restarts.node_wait,
            min_nodes=self.plan.min_nodes, drop_slow=self.plan.stragglers.action == straggler.Treatment.DROP,
        )
        if decision.action == Action.END:
            assert decision.end_state is not None
            self._end(decision.end_state, decision.reason, wall)
        elif decision.action == Action.WAIT:
            if record.phase != Phase.WAITING:
                self.log(decision.reason)
                self.wait_until = now + self.plan.restarts.node_wait
                self._change(phase=Phase.WAITING, waiting=decision.reason)
                self.phase_since = now
        else:
            first, detected_at = record.first_failure, record.detected_at
            assert detected_at is not None
            cause = Cause(**dataclasses.asdict(first), detected_at=detected_at,
                          detect_s=round(detected_at - first.at, 1), failed_step=record.failed_step)
            self._restart(decision, cause, now, wall)

    def _welcome_back(self, now: float) -> None:
        """Lost members heard again since they were lost, with no trainer running, may take part again."""
        back = [n for n in self.record.lost if self.members.silent(n, now) is None
                and (self.members[n].heard or 0.0) > self.lost_at.get(n, now) and not self.members[n].running()]
        if back:
            self.log(f"{', '.join(back)} answered again")
            for node in back:
                self.lost_at.pop(node, None)
            self._change(lost={n: why for n, why in self.record.lost.items() if n not in back})

    def _restart(self, decision: Decision, cause: Cause, now: float, wall: float) -> None:
        """Start the next attempt as ``decision`` says, ``cause`` having ended this one (a failure, or a grow)."""
        if self.took_over and now - self.started < self.timings.takeover_wait:
            return  # a hub that took over lets the old attempt's last processes end first (trainer.runtime.job.timing)
        if not self.members.has_quorum(now):
            fresh, needed = self.members.quorum(now)
            if self.record.phase != Phase.WAITING or "majority" not in self.record.waiting:
                self.log(f"cannot restart yet: {fresh} of {len(self.members)} members heard, {needed} needed")
                self.majority_until = now + self.plan.restarts.node_wait
                self._change(phase=Phase.WAITING, waiting=f"a majority of members ({fresh} heard, {needed} needed)")
            elif self.majority_until is not None and now > self.majority_until:
                self._end(EndState.FAILED, f"{decision.reason}; but only {fresh} of the job's {len(self.members)} "
                          f"members could be heard ({needed} needed) for {self.plan.restarts.node_wait:.0f} s", wall)
            return
        assignment = decision.assignment
        rank0 = next(node for node, rank in assignment.items() if rank == 0)
        ip = next(m.ip for m in self.plan.members if m.name == rank0)
        report = self.members[rank0].report
        port = report.port_offer if report is not None and report.port_offer else self.plan.port
        rendezvous = f"tcp://{layout.url_host(ip)}:{port}"
        attempt = self.record.attempt + 1
        entry = Attempt(attempt=attempt, started_at=wall, assignment=assignment, rendezvous=rendezvous, cause=cause,
                        stopped_at=self.stopped_at, nodes={})
        self.log(f"attempt {attempt}: {decision.reason}")
        changes = self.record.world_changes
        if decision.left or decision.joined:
            dropped = cause.kind == Kind.SLOW and cause.node in decision.left  # a straggler dropped
            why = Kind.JOINED if decision.joined else Kind.SLOW if dropped else Kind.LOST
            changes = (*changes, WorldChange(attempt=attempt, at=wall, left=decision.left, joined=decision.joined,
                                             before=len(self.record.assignment), after=len(assignment), cause=why))
        self.failures, self.first_seen, self.wait_until, self.majority_until = [], None, None, None
        self.stopped_at = None
        self.acted = True
        self.slow.reset()
        self._change(attempt=attempt, phase=Phase.RUNNING, assignment=assignment, rendezvous=rendezvous,
                     world_urls=world_urls(self.plan, assignment), attempts=(*self.record.attempts, entry),
                     restarts=self.record.restarts + (0 if cause.kind == Kind.JOINED else 1),  # a grow is no failure
                     first_failure=None, detected_at=None, failed_step=None, waiting="",
                     stragglers=straggler.swapped(self.record, decision.replaced, decision.left), spent=self._spent(),
                     world_changes=changes)
        self._change(goodput=goodput.account(self.record, None, wall))
        self.phase_since = now

    def _spent(self) -> tuple[Spent, ...]:
        """The efforts of the ended attempts, the current one's added (it is over)."""
        effort = self.paces.effort(self.record.attempt, self.record.assignment)
        return self.record.spent if effort is None else (*self.record.spent, Spent(self.record.attempt, effort))

    def _note_timeline(self, node: str, timeline: NodeTimeline) -> None:
        """A member's account of its trainer in the current attempt: how it started, the phases it reached."""
        current = self.record.attempts[-1]
        if self.record.end is not None or node not in current.assignment or current.nodes.get(node) == timeline:
            return  # after the end, the record stays as the members last heard it
        entry = dataclasses.replace(current, nodes={**current.nodes, node: timeline})
        self._change(attempts=(*self.record.attempts[:-1], entry))

    def _end(self, state: EndState, reason: str, wall: float) -> None:
        self.acted = True
        self.log(f"the job {state}: {reason}")
        self._change(phase=Phase.ENDED, end=End(state=state, reason=reason, first_failure=self.first()),
                     spent=self._spent())
        self._change(goodput=goodput.account(self.record, None, wall))

    def _change(self, **fields: object) -> None:
        self.record = self.record.changed(**fields)


def _step(progress: JsonObject | None) -> int | None:
    """The last step rank 0 reported (its status.json's "step"), if it is a number."""
    step = (progress or {}).get("step")
    return step if isinstance(step, int) and not isinstance(step, bool) else None
