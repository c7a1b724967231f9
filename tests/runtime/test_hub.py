"""The job's hub (trainer.runtime.job.hub) driven directly: members' reports and the passing of time in, the job's
record out. No sockets, no processes."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from tests.runtime.test_plan import job, plans
from trainer.runtime import schema
from trainer.runtime.job.hub import Hub, new_record
from trainer.runtime.job.record import Changes, JobRecord, Kind, NodeTimeline, Start, with_changes
from trainer.runtime.job.timing import HANG_FLOOR_S
from trainer.runtime.plan import NodePlan
from trainer.runtime.watch import wire
from trainer.runtime.watch.hubhost import HubHost
from trainer.runtime.watch.messages import (
    CHECKPOINT,
    COLLECTIVE,
    COMPUTE,
    DATA,
    EVALUATE,
    IDLE,
    VALIDATE,
    RankProgress,
    RecordReply,
    Report,
    Says,
    Trainer,
    TrainerState,
    Trouble,
    read_reply,
)

HT = 60.0  # the plans' heartbeat timeout


def plan(nodes: int = 2, spares: int = 0, **extra: Any) -> NodePlan:
    return plans(job([f"/home/{i}" for i in range(nodes + spares)], spares=spares, **extra))["n0"]


def report(node: str, trainer: Trainer, trouble: Trouble | None = None, **fields: Any) -> Report:
    """A member's report to the hub."""
    given = {"says": Says.REPORT, "node": node, "term": 0, "addr": f"{node}:1", "version": 0, "trainer": trainer,
             "trouble": trouble, "progress": None, "port_offer": None, "record": None, "pace": None,
             "timeline": None}
    return Report(**{**given, **fields})


class Job:
    """A hub and its members' trainers, on a clock the test moves."""

    def __init__(self, p: NodePlan, term: int = 0, record: JobRecord | None = None,
                 lost_hub: str | None = None) -> None:
        self.now, self.wall, self.log = 1000.0, 1.7e9, []
        self.hub = Hub(p, record or new_record(p, self.wall), term, self.now, self.wall, self.log.append,
                       lost_hub=lost_hub)
        self.trainers: dict[str, Trainer] = {}
        self.troubles: dict[str, Trouble] = {}
        self.ranks: dict[str, tuple[RankProgress, ...]] = {}  # where each member's ranks are, as it reports
        self.importing: set[str] = set()  # members whose standby has not done its imports (the others' has)
        # Members' running trainers report their timeline, each with its first step taken, unless in ``starting``
        # (off by default: most tests are about other things than timelines).
        self.stepping = False
        self.starting: set[str] = set()

    @property
    def record(self) -> JobRecord:
        return self.hub.record

    def report(self, *nodes: str) -> None:
        """These members report: each runs the attempt the record assigns it (a simple, obedient member)."""
        attempt = self.record.attempt
        for node in nodes:
            assigned = node in self.record.assignment and self.record.phase == "running"
            current = self.trainers.get(node, IDLE)
            if assigned and current.attempt != attempt:
                current = dataclasses.replace(IDLE, attempt=attempt, state=TrainerState.RUNNING)
            elif not assigned and current.running:
                current = dataclasses.replace(current, state=TrainerState.EXITED, rc=-15, ended=self.wall)
            self.trainers[node] = current
            self.hub.heard(node, report(node, current, self.troubles.get(node), port_offer=40000 + attempt,
                                        ranks=self.ranks.get(node, ()), standby=node not in self.importing,
                                        timeline=self.timeline(node, current)), self.now)

    def timeline(self, node: str, trainer: Trainer) -> NodeTimeline | None:
        if not self.stepping or not trainer.running:
            return None
        return NodeTimeline(start=Start.IN_PLACE, fallback="", started=self.wall, imported=self.wall, group=self.wall,
                            checkpoint=None, first_step=None if node in self.starting else self.wall)

    def exit(self, node: str, rc: int) -> None:
        self.trainers[node] = dataclasses.replace(self.trainers[node], state=TrainerState.EXITED, rc=rc,
                                                  ended=self.wall)

    def tick(self, seconds: float, *reporting: str) -> None:
        """Time passes in steps of a second; these members report at every step."""
        for _ in range(int(seconds)):
            self.now, self.wall = self.now + 1, self.wall + 1
            self.report(*reporting)
            self.hub.tick(self.now, self.wall)


def test_every_trainer_exits_0_and_the_job_has_finished() -> None:
    j = Job(plan())
    j.tick(3, "n0", "n1")
    assert j.record.phase == "running" and j.record.directory == {"n0": "n0:1", "n1": "n1:1"}
    j.exit("n0", 0)
    j.exit("n1", 0)
    j.tick(1, "n0", "n1")
    assert j.record.end.state == "finished" and j.record.restarts == 0


def test_one_trainer_done_while_another_still_trains_is_no_finish() -> None:
    """n0's trainer has trained its last step and exited 0; n1's still runs its last epoch: the job goes on until it
    has finished too."""
    j = Job(plan())
    j.tick(3, "n0", "n1")
    j.exit("n0", 0)
    j.tick(5, "n0", "n1")
    assert j.record.end is None and j.record.phase == "running" and j.record.attempt == 0, j.record.end
    j.exit("n1", 0)
    j.tick(1, "n0", "n1")
    assert j.record.end is not None and j.record.end.state == "finished"

def test_a_killed_trainer_stops_the_attempt_and_the_job_restarts_on_a_fresh_rendezvous() -> None:
    j = Job(plan())
    j.tick(3, "n0", "n1")
    j.exit("n1", -9)
    j.exit("n0", 1)  # its peer lost: a consequence
    j.tick(5, "n0", "n1")
    assert j.record.attempt == 1 and j.record.phase == "running" and j.record.restarts == 1
    assert j.record.rendezvous == "tcp://10.9.0.10:40000"  # the port the rank-0 node offered, not the first one
    assert j.record.world_urls == ("10.9.0.10", "10.9.0.11")
    cause = j.record.attempts[1].cause
    assert cause is not None
    assert (cause.node, cause.kind, cause.rc) == ("n1", "killed", -9)
    assert any("n1 failed first: its trainer was killed by signal 9" in line for line in j.log)


def test_restarts_end_when_the_same_node_fails_the_same_way_again_without_a_spare() -> None:
    j = Job(plan())
    for _ in range(2):
        j.tick(3, "n0", "n1")
        j.exit("n1", -9)
        j.tick(5, "n0", "n1")
    assert j.record.end.state == "failed" and j.record.restarts == 1
    assert "the same way as in the attempt before" in j.record.end.reason


def test_a_silent_node_is_lost_and_a_spare_takes_its_rank() -> None:
    j = Job(plan(nodes=3, spares=1))
    j.tick(3, "n0", "n1", "n2", "n3")
    j.tick(HT + 5, "n0", "n1", "n3")  # n2 is silent; its peers' trainers carry on (they would fail in a collective)
    assert j.record.attempt == 1 and j.record.assignment == {"n0": 0, "n1": 1, "n3": 2}
    assert "n2" in j.record.lost and j.record.attempts[1].cause.kind == "lost"
    assert j.record.attempts[1].cause.detect_s >= HT  # from the last sign of life to the decision


def test_a_node_lost_for_good_is_the_cause_although_its_peers_exited_first() -> None:
    """Its peers' trainers exit at once (their collective broke); the node itself is silent only a heartbeat
    timeout later, while the attempt stops: the verdict names the lost node, not the first exit."""
    j = Job(plan(nodes=2, spares=1))
    j.tick(3, "n0", "n1", "n2")
    j.exit("n0", 1)
    j.tick(HT + 5, "n0", "n2")  # n1 is gone: no exit, no report
    assert j.record.attempt == 1 and j.record.assignment == {"n0": 0, "n2": 1}
    cause = j.record.attempts[1].cause
    assert cause is not None
    assert (cause.node, cause.kind) == ("n1", "lost"), cause
    assert any(line.startswith("attempt 1: n1 failed first: ") for line in j.log), j.log
    # Detected when it was named lost (here it never confirmed the stop), not when its peers exited: the wait for
    # it is the detection's time, and the restart's (restart_s, from detected_at) starts once the loss is known.
    assert cause.detected_at == j.record.attempts[1].started_at and cause.detect_s == 50, cause


def test_a_hub_that_cannot_hear_a_majority_stops_its_attempt_and_starts_none() -> None:
    j = Job(plan(nodes=2, spares=2))  # 4 members: 3 make a majority
    j.tick(3, "n0", "n1", "n2", "n3")
    j.tick(HT / 2 + 6, "n0", "n1")  # both spares fall silent: the trainers run, but the hub hears 2 of 4
    assert j.record.phase in ("stopping", "waiting") and j.record.attempt == 0
    j.exit("n0", -15)
    j.exit("n1", -15)
    j.tick(10, "n0", "n1")
    assert j.record.attempt == 0 and "majority" in j.record.waiting  # no new attempt without a majority
    j.tick(300, "n0", "n1")  # node_wait passes
    assert j.record.end.state == "failed" and "(3 needed)" in j.record.end.reason


def test_a_hub_that_took_over_counts_the_old_hub_lost_learns_the_job_and_waits_a_grace_first() -> None:
    p = plan(nodes=2, spares=1)
    launched = Job(p)
    launched.tick(2, "n0", "n1", "n2")
    old = launched.record
    j = Job(plans(job(["/home/0", "/home/1", "/home/2"], spares=1))["n1"], term=1, record=old, lost_hub="n0")
    assert j.record.term == 1 and j.record.hub == "n1" and "n0" in j.record.lost
    newer = dataclasses.replace(old, version=old.version + 5, restarts=2)
    j.hub.adopt(newer)  # a member heard more of the old hub than this one did
    assert j.record.restarts == 2 and j.record.term == 1 and "n0" in j.record.lost
    j.tick(4, "n1", "n2")
    assert j.record.attempt == 0  # the old attempt's last processes get a stop grace to end everywhere
    j.tick(p.watch.stop_grace + 5, "n1", "n2")
    assert j.record.attempt == 1 and j.record.assignment == {"n1": 0, "n2": 1}
    assert j.record.rendezvous.startswith("tcp://10.9.0.11:") and j.record.restarts == 3
    j.hub.adopt(dataclasses.replace(newer, version=newer.version + 50))  # after acting, a hub adopts nothing
    assert j.record.attempt == 1


def test_the_hub_lets_a_failures_cause_arrive_before_it_names_one() -> None:
    """The killed node's exit reaches the hub a moment after its peer's (the peer's collective broke first): the hub
    waits the settling time, then names the kill, not the consequence."""
    j = Job(plan())
    j.tick(3, "n0", "n1")
    j.exit("n0", 1)  # "connection closed by peer"
    j.report("n0")
    j.hub.tick(j.now, j.wall)
    assert j.record.phase == "running"  # not named yet
    j.now += j.hub.timings.settle / 2
    j.exit("n1", -9)  # its supervisor saw the kill first, but its report arrives second
    j.trainers["n1"] = dataclasses.replace(j.trainers["n1"], ended=j.wall - 1)
    j.report("n1")
    j.now += j.hub.timings.settle / 2
    j.hub.tick(j.now, j.wall)  # named, and with no trainer left running, restarted at once
    cause = j.record.attempts[-1].cause
    assert j.record.attempt == 1 and cause is not None and (cause.node, cause.kind) == ("n1", "killed")


def test_a_member_whose_trainer_does_not_stop_is_lost_after_the_confirm_time() -> None:
    """Heard, but its trainer still running after the stop grace and the confirm time: the node is lost (its trainer
    may hold the attempt's rendezvous), and a spare takes its rank."""
    j = Job(plan(nodes=2, spares=1))
    j.tick(3, "n0", "n1", "n2")
    j.exit("n0", -9)
    stuck = j.trainers["n1"]
    for _ in range(int(j.hub.timings.settle + j.hub.timings.confirm_stop) + 3):
        j.report("n0", "n2")
        j.hub.heard("n1", report("n1", stuck), j.now)  # it answers, and its trainer still runs attempt 0
        j.now, j.wall = j.now + 1, j.wall + 1
        j.hub.tick(j.now, j.wall)
    assert j.record.lost.get("n1") == "it did not confirm that its trainer stopped", j.record.lost
    assert j.record.attempt == 1 and j.record.assignment == {"n0": 0, "n2": 1}


def test_a_lost_member_heard_again_with_its_trainer_stopped_is_welcomed_back() -> None:
    j = Job(plan())  # no spare: the hub waits for the lost node
    j.tick(3, "n0", "n1")
    j.tick(HT + 5, "n0")
    assert j.record.phase == "waiting" and "n1" in j.record.lost
    j.trainers["n1"] = dataclasses.replace(j.trainers["n1"], state=TrainerState.EXITED, rc=-9)
    j.tick(3, "n0", "n1")
    assert j.record.lost == {} and j.record.attempt == 1 and j.record.assignment == {"n0": 0, "n1": 1}
    assert "n1 answered again" in j.log


def test_the_launchs_hub_keeps_its_record_when_a_member_joins_again_with_its_older_copy() -> None:
    """A member back from a cut joins with the record it last heard (a version of this very hub's record): the hub
    adopts nothing from it; only a hub that took over learns the job from its members."""
    j = Job(plan())
    j.tick(3, "n0", "n1")
    old = j.record
    j.exit("n1", -9)
    j.report("n1")
    j.hub.tick(j.now, j.wall)
    j.now += j.hub.timings.settle
    j.hub.tick(j.now, j.wall)
    assert j.record.phase == "stopping" and not j.hub.acted  # n0's trainer is still stopping
    j.hub.adopt(dataclasses.replace(old, version=old.version + 1))  # newer than the hub's first record
    assert j.record.phase == "stopping" and j.record.first_failure is not None


def test_a_parked_trainer_is_its_peers_consequence_and_the_hub_names_the_cause_without_waiting() -> None:
    """n1 killed, n0's trainer parked at once (restart in place): every node of the attempt has failed, so the hub
    names the kill at once (no settling time) and restarts, recording when the attempt was over; each member's
    timeline of the new attempt goes into its entry, and a timeline of another attempt or node does not."""
    j = Job(plan(nodes=2, spares=1))
    j.tick(3, "n0", "n1", "n2")
    j.trainers["n0"] = dataclasses.replace(j.trainers["n0"], state=TrainerState.PARKED, ended=j.wall)
    j.exit("n1", -9)
    j.trainers["n1"] = dataclasses.replace(j.trainers["n1"], ended=j.wall - 0.5)  # the kill came first
    j.report("n0", "n1", "n2")
    named = j.record.version
    j.hub.tick(j.now, j.wall)  # named without the settling time (nothing else can arrive), and no trainer runs:
    entry = j.record.attempts[1]  # the attempt is over everywhere, and the next one starts in the same tick
    assert j.record.attempt == 1 and entry.stopped_at == j.wall and entry.cause.detected_at == j.wall
    assert (entry.cause.node, entry.cause.kind) == ("n1", "killed") and j.record.version > named
    timeline = NodeTimeline(start=Start.IN_PLACE, fallback="", started=j.wall, imported=j.wall, group=None,
                            checkpoint=None, first_step=None)
    running = dataclasses.replace(IDLE, attempt=1, state=TrainerState.RUNNING)
    j.hub.heard("n0", report("n0", running, timeline=timeline), j.now)
    j.hub.heard("n1", report("n1", dataclasses.replace(running, attempt=0), timeline=timeline), j.now)  # the old one
    j.hub.heard("n2", report("n2", running, timeline=timeline), j.now)  # a spare: not in the attempt
    assert j.record.attempts[1].nodes == {"n0": timeline}
    version = j.record.version
    j.hub.heard("n0", report("n0", running, timeline=timeline), j.now)
    assert j.record.version == version  # the same timeline again changes nothing


def test_a_member_gets_unchanged_when_it_holds_the_record_the_changes_when_only_members_entries_changed() -> None:
    j = Job(plan(nodes=3))
    host = HubHost(j.hub)
    j.tick(1, "n0", "n1", "n2")
    joined, _ = host.answer("n1", report("n1", j.trainers["n1"], says=Says.JOIN, record=j.record), j.now)
    assert joined.says == Says.RECORD and joined.record == j.record  # a join always gets the record
    held = j.record

    def answer(node: str, version: int, term: int = 0, **fields: Any) -> RecordReply:
        return host.answer(node, report(node, j.trainers[node], version=version, term=term, **fields), j.now)[0]

    same = answer("n1", held.version)
    assert same.says == Says.UNCHANGED and same.record is None and same.changes is None
    assert answer("n1", held.version, term=1).says == Says.RECORD  # the same version of another hub's record
    answer("n2", held.version, addr="n2:2")  # n2's supervisor listens elsewhere now: only the directory changes
    behind = answer("n1", held.version)
    assert behind.says == Says.CHANGES and behind.record is None and behind.changes is not None
    assert behind.changes.directory == {"n2": "n2:2"} and behind.changes.timelines == {}
    assert with_changes(held, behind.changes) == j.record


def test_a_member_behind_a_failure_and_an_attempt_gets_the_changes_and_one_too_far_behind_the_record() -> None:
    """A failure named, then the next attempt: a member one version behind each, and one that missed both, get only
    what changed (through the wire's JSON and the door's checks) and hold exactly the hub's record after; a member
    behind by more versions than the hub keeps gets the whole record."""
    j = Job(plan(nodes=3))
    host = HubHost(j.hub)
    j.tick(1, "n0", "n1", "n2")

    def answer(node: str, version: int) -> RecordReply:
        reply = host.answer(node, report(node, j.trainers[node], version=version), j.now)[0]
        wired = read_reply(json.loads(wire.canonical(schema.dump(reply))))  # as the member reads it
        assert wired == reply
        return reply

    def behind(held: JobRecord) -> Changes:
        reply = answer("n1", held.version)
        assert reply.says == Says.CHANGES and reply.changes is not None and reply.record is None
        assert with_changes(held, reply.changes) == j.record
        return reply.changes

    launch = j.record
    assert answer("n1", launch.version).says == Says.UNCHANGED
    j.exit("n2", -9)
    j.report("n0", "n1", "n2")
    j.hub.tick(j.now, j.wall)
    j.now += j.hub.timings.settle
    j.hub.tick(j.now, j.wall)
    assert j.record.phase == "stopping" and j.record.attempt == 0
    named = behind(launch)
    assert named.attempts == () and {"phase", "first_failure", "detected_at"} <= named.fields.keys()
    assert "assignment" not in named.fields and named.directory == {} and named.timelines == {}
    stopping = j.record
    j.tick(5, "n0", "n1", "n2")
    assert j.record.attempt == 1
    started = behind(stopping)
    assert [a.attempt for a in started.attempts] == [1] and started.fields["phase"] == "running"
    both = behind(launch)
    assert [a.attempt for a in both.attempts] == [1] and both.fields.keys() >= named.fields.keys()
    for n in range(host.kept + 1):  # n2's address moves, each version answered: the hub keeps only the latest
        answer("n2", j.record.version)
        j.hub.heard("n2", report("n2", j.trainers["n2"], addr=f"n2:{n}"), j.now)
    far = answer("n1", launch.version)
    assert far.says == Says.RECORD and far.record == j.record and far.changes is None


def test_a_stop_or_an_attempt_started_is_pushed_to_each_member_that_lacks_it_and_nothing_else_is() -> None:
    """The host's tick says when the record has news every member must act on at once (a failure named and the
    attempt stopping, an attempt started, the end):
    the listener then pushes each member what its last report would get now, marked pushed."""
    j = Job(plan(nodes=3))
    host = HubHost(j.hub)

    def second() -> bool:
        j.now, j.wall = j.now + 1, j.wall + 1
        j.report("n0", "n1", "n2")
        return host.tick(report("n0", j.trainers["n0"], port_offer=40000, standby=True), j.now, j.wall)

    assert host.push("n1") is None  # n1 has not reported yet: nothing to push it
    assert not any(second() for _ in range(3))  # attempt 0 is the launch's: every member starts with it
    held = j.record
    host.answer("n1", report("n1", j.trainers["n1"], version=held.version), j.now)
    assert host.push("n1") is None  # it holds this record
    j.hub.heard("n2", report("n2", j.trainers["n2"], addr="n2:2"), j.now)
    assert not second()  # an address moved: news for every member's next report, not a push
    j.exit("n2", -9)
    news = [second() for _ in range(8)]
    assert j.record.attempt == 1 and news.count(True) == 2  # the failure named (stopping), then the attempt
    host.answer("n1", report("n1", j.trainers["n1"], version=held.version), j.now)
    pushed = host.push("n1")
    assert pushed is not None and pushed.pushed and pushed.says == Says.CHANGES and pushed.changes is not None
    assert with_changes(held, pushed.changes) == j.record
    assert read_reply(json.loads(wire.canonical(schema.dump(pushed)))) == pushed  # as the member reads it
    whole = host.push("n2")  # its last report (version 0 from j.report) is too far behind: the record
    assert whole is not None and whole.pushed and whole.record == j.record


def test_a_member_that_missed_timelines_of_an_attempt_and_the_next_attempt_gets_the_whole_record() -> None:
    """Timelines of attempt 0 arrive, then attempt 1 starts: changes carry the newest attempt's timelines only, so a
    member that held attempt 0 without them gets the whole record (its attempt 0 would stay stale otherwise)."""
    j = Job(plan(nodes=2))
    host = HubHost(j.hub)
    j.tick(1, "n0", "n1")
    held = j.record
    host.answer("n1", report("n1", j.trainers["n1"], version=held.version), j.now)
    timeline = NodeTimeline(start=Start.PROCESS, fallback="", started=j.wall, imported=j.wall, group=None,
                            checkpoint=None, first_step=None)
    j.hub.heard("n0", report("n0", j.trainers["n0"], timeline=timeline), j.now)
    host.answer("n0", report("n0", j.trainers["n0"], version=j.record.version), j.now)  # answered: logged
    assert j.record.attempts[0].nodes == {"n0": timeline}
    j.exit("n0", -9)
    j.tick(5, "n0", "n1")
    assert j.record.attempt == 1
    reply = host.answer("n1", report("n1", j.trainers["n1"], version=held.version), j.now)[0]
    assert reply.says == Says.RECORD and reply.record == j.record


def test_a_kill_is_named_at_once_and_a_plain_exit_after_the_settling_time() -> None:
    """A trainer killed by a signal is no peer's consequence: the hub stops the attempt in the tick that hears it. A
    plain exit may be a consequence: the hub waits for its cause first."""
    j = Job(plan(nodes=3))
    j.tick(3, "n0", "n1", "n2")
    j.exit("n2", -9)
    j.report("n2")
    j.hub.tick(j.now, j.wall)
    assert j.record.phase == "stopping" and j.record.detected_at == j.wall, j.record.phase
    exited = Job(plan(nodes=3))
    exited.tick(3, "n0", "n1", "n2")
    exited.exit("n2", 1)
    exited.report("n2")
    exited.hub.tick(exited.now, exited.wall)
    assert exited.record.phase == "running"
    exited.now += exited.hub.timings.settle
    exited.hub.tick(exited.now, exited.wall)
    assert exited.record.phase == "stopping"


def test_a_bad_input_whose_trainer_exits_after_its_peer_parked_ends_the_job_without_a_restart() -> None:
    """n1's trainer rejects its input; its collective breaks as it begins to exit, so n0's trainer parks first, and n1's
    exit (its loader workers, its group) outlasts the settling time: the hub names the park and stops the attempt.
    When n1's exit arrives it is the cause, and the job ends: a restart cannot fix a bad input (slow lane, CI)."""
    j = Job(plan(nodes=2, spares=1))
    j.tick(3, "n0", "n1", "n2")
    j.trainers["n0"] = dataclasses.replace(j.trainers["n0"], state=TrainerState.PARKED, ended=j.wall)
    j.report("n0", "n1", "n2")
    j.hub.tick(j.now, j.wall)
    j.now += j.hub.timings.settle
    j.hub.tick(j.now, j.wall)
    assert j.record.phase == "stopping" and j.record.first_failure.kind == "parked", j.record.first_failure
    j.now, j.wall = j.now + 1, j.wall + 1
    j.exit("n1", 2)
    j.report("n0", "n1", "n2")
    j.hub.tick(j.now, j.wall)
    assert j.record.end is not None and j.record.end.state == "failed", j.record
    assert j.record.attempt == 0 and j.record.restarts == 0
    assert (j.record.first_failure.node, j.record.first_failure.kind) == ("n1", "rejected")


def test_a_stop_that_comes_after_the_last_step_ends_the_job_finished_not_stopped() -> None:
    # A user's stop or Slurm's time limit while the trainers finish their last epoch (the final evaluation): they exit
    # 0. The job trained to the end: it finished (under Slurm: no requeue into an allocation with nothing to do).
    for kind in (Kind.STOPPED, Kind.PREEMPTED):
        j = Job(plan())
        j.tick(3, "n0", "n1")
        j.troubles = {n: Trouble(attempt=0, kind=kind, reason="asked", at=j.wall) for n in ("n0", "n1")}
        j.tick(1, "n0", "n1")
        assert j.record.phase == "stopping", kind
        j.exit("n0", 0)
        j.exit("n1", 0)
        j.tick(1, "n0", "n1")
        assert j.record.end is not None and j.record.end.state == "finished", (kind, j.record.end)
        assert j.record.restarts == 0 and "before it could stop" in j.record.end.reason


def test_a_stop_that_came_in_time_is_not_a_finish() -> None:
    j = Job(plan())
    j.tick(3, "n0", "n1")
    j.troubles = {n: Trouble(attempt=0, kind=Kind.STOPPED, reason="asked", at=j.wall) for n in ("n0", "n1")}
    j.tick(1, "n0", "n1")
    j.exit("n0", 75)
    j.exit("n1", 75)
    j.tick(1, "n0", "n1")
    assert j.record.end is not None and j.record.end.state == "stopped"


def stalled(rank: int, phase: str, seconds: float, step: int = 40, step_s: float = 0.5) -> RankProgress:
    """A rank whose step has not advanced for ``seconds``, in ``phase`` all that time."""
    return RankProgress(rank=rank, step=step, phase=phase, phase_s=seconds, stalled_s=seconds, step_s=step_s)


def test_a_rank_whose_step_stalls_while_the_others_wait_in_a_collective_is_named_hung_and_the_attempt_stops() -> None:
    j = Job(plan())
    j.tick(2, "n0", "n1")
    # n1's rank 1 is stuck in its data for the floor (15 s at the defaults: more than 10 x its 0.5 s step) less a
    # second; rank 0 waits for it in the gradient all-reduce.
    floor = HANG_FLOOR_S
    j.ranks = {"n0": (stalled(0, COLLECTIVE + "gradients", floor - 1),), "n1": (stalled(1, DATA, floor - 1),)}
    j.tick(1, "n0", "n1")
    assert j.record.phase == "running" and not j.hub.failures
    j.ranks = {"n0": (stalled(0, COLLECTIVE + "gradients", floor + 1),), "n1": (stalled(1, DATA, floor + 1),)}
    j.tick(1, "n0", "n1")
    first = j.record.first_failure
    assert j.record.phase == "stopping" and first is not None and (first.node, first.kind) == ("n1", Kind.HUNG)
    assert first.reason == ("its rank 1 hung in data, 40 steps into its attempt: no step for 16 s (its usual step: "
                            "0.50 s), while rank(s) 0 wait in a collective"), first.reason
    assert first.at == j.wall - (floor + 1)  # its last step: the last sign of its progress


def test_a_rank_stuck_in_a_validation_batch_while_the_others_wait_in_the_sums_is_named_hung() -> None:
    j = Job(plan())
    j.tick(2, "n0", "n1")
    # n1's rank 1 has had no validation batch for the floor less a second (its loader worker never answers); rank 0
    # finished its shard and waits in the metrics' all-reduce. Validating takes as long as the set does: only a batch
    # is judged.
    floor, sums = HANG_FLOOR_S, COLLECTIVE + "metrics"
    j.ranks = {"n0": (stalled(0, sums, floor - 1),), "n1": (stalled(1, VALIDATE, floor - 1),)}
    j.tick(1, "n0", "n1")
    assert j.record.phase == "running" and not j.hub.failures
    j.ranks = {"n0": (stalled(0, sums, floor + 1),), "n1": (stalled(1, VALIDATE, floor + 1),)}
    j.tick(1, "n0", "n1")
    first = j.record.first_failure
    assert j.record.phase == "stopping" and first is not None and (first.node, first.kind) == ("n1", Kind.HUNG)
    assert first.reason == ("its rank 1 hung in validate, 40 steps into its attempt: no validation batch for 16 s (its "
                            "usual step: 0.50 s), while rank(s) 0 wait in a collective"), first.reason


def test_only_the_rank_the_others_wait_for_is_named_never_a_waiter() -> None:
    j = Job(plan(nodes=3))
    j.tick(2, "n0", "n1", "n2")
    # n0 and n1 have waited in the all-reduce longer than n2 has been stuck in its compute: n2 is the one.
    j.ranks = {"n0": (stalled(0, COLLECTIVE + "gradients", 40),), "n1": (stalled(1, COLLECTIVE + "gradients", 30),),
               "n2": (stalled(2, COMPUTE, HANG_FLOOR_S + 1, step=41),)}
    j.tick(1, "n0", "n1", "n2")
    first = j.record.first_failure
    assert first is not None and (first.node, first.kind) == ("n2", Kind.HUNG), j.hub.failures
    assert "while rank(s) 0, 1 wait in a collective" in first.reason, first.reason


def test_waiters_are_not_named_while_a_rank_cannot_say_where_it_is_nor_on_a_stale_report() -> None:
    j = Job(plan(nodes=3))
    j.tick(2, "n0", "n1", "n2")
    # n2's rank stopped beating (frozen: its node names it, at its heartbeat timeout), so n2 reports no ranks; the
    # others wait for it far beyond the floor, and are no hang.
    waiting = {"n0": (stalled(0, COLLECTIVE + "gradients", 50),), "n1": (stalled(1, COLLECTIVE + "gradients", 50),)}
    j.ranks = {**waiting, "n2": ()}
    j.tick(1, "n0", "n1", "n2")
    assert j.record.phase == "running" and not j.hub.failures
    # n2's last report said its rank waits in the all-reduce too, since before n1 entered it; then n2 fell silent
    # (its supervisor stopped: it is lost at the heartbeat timeout). Every rank waits and n1 came last: judged on
    # n2's stale report, n1 would be named once past the floor.
    j.ranks = {"n0": (stalled(0, COLLECTIVE + "gradients", 40),), "n1": (stalled(1, COLLECTIVE + "gradients", 5),),
               "n2": (stalled(2, COLLECTIVE + "gradients", 30),)}
    j.tick(1, "n0", "n1", "n2")
    j.tick(int(2 * j.hub.timings.report_every) + 1, "n0", "n1")
    j.ranks["n1"] = (stalled(1, COLLECTIVE + "gradients", HANG_FLOOR_S + 5),)
    j.tick(1, "n0", "n1")
    assert not [f for f in j.hub.failures if f.kind == Kind.HUNG], j.hub.failures
    # A rank that evaluates (an epoch's end, not judged) while another already waits at the barrier after it: no hang.
    j = Job(plan(nodes=3))
    j.tick(2, "n0", "n1", "n2")
    j.ranks = {"n0": (stalled(0, COLLECTIVE + "barrier", 50),), "n1": (stalled(1, COLLECTIVE + "barrier", 40),),
               "n2": (stalled(2, EVALUATE, 50),)}
    j.tick(1, "n0", "n1", "n2")
    assert j.record.phase == "running" and not j.hub.failures


def test_when_every_rank_waits_in_a_collective_the_last_to_enter_it_is_named() -> None:
    j = Job(plan(nodes=3))
    j.tick(2, "n0", "n1", "n2")
    # The last to enter the all-reduce has waited less than the floor: the others wait for it, which is no hang yet.
    j.ranks = {"n0": (stalled(0, COLLECTIVE + "gradients", 40),), "n1": (stalled(1, COLLECTIVE + "gradients", 10),),
               "n2": (stalled(2, COLLECTIVE + "gradients", 30),)}
    j.tick(1, "n0", "n1", "n2")
    assert j.record.phase == "running" and not j.hub.failures
    j.ranks = {"n0": (stalled(0, COLLECTIVE + "gradients", 40),), "n1": (stalled(1, COLLECTIVE + "gradients", 20),),
               "n2": (stalled(2, COLLECTIVE + "gradients", 30),)}
    j.tick(1, "n0", "n1", "n2")
    first = j.record.first_failure
    assert first is not None and (first.node, first.kind) == ("n1", Kind.HUNG), j.hub.failures
    assert "while rank(s) 0, 2 wait in a collective" in first.reason, first.reason


def test_a_checkpoint_may_take_the_heartbeat_timeout_and_a_tenfold_slower_step_is_no_hang() -> None:
    j = Job(plan())
    j.tick(2, "n0", "n1")
    # n1 saves a large model's checkpoint for more than the floor while n0 waits at the barrier after it; or n1's
    # node slowed tenfold (a 1 s step now takes 10 s: a straggler, not a hang).
    for ranks in ({"n0": (stalled(0, COLLECTIVE + "barrier", HT - 1),), "n1": (stalled(1, CHECKPOINT, HT - 1),)},
                  {"n0": (stalled(0, COLLECTIVE + "gradients", 10),), "n1": (stalled(1, COMPUTE, 10, step_s=1),)}):
        j.ranks = ranks
        j.tick(1, "n0", "n1")
        assert j.record.phase == "running" and not j.hub.failures, ranks
    j.ranks = {"n0": (stalled(0, COLLECTIVE + "barrier", HT + 1),), "n1": (stalled(1, CHECKPOINT, HT + 1),)}
    j.tick(1, "n0", "n1")
    first = j.record.first_failure
    assert first is not None and (first.node, first.kind) == ("n1", Kind.HUNG), j.hub.failures


def test_a_long_step_phase_is_no_hang_while_no_rank_waits_for_it_nor_an_epochs_end() -> None:
    j = Job(plan(watch={"hang_factor": 4}))
    j.tick(2, "n0", "n1")
    # Every rank evaluates at an epoch's end (no step for minutes), or computes a step 4 x longer than usual (a
    # slow step the others have not reached the all-reduce of yet), or one is far behind but nobody waits: no hang.
    for ranks in ({"n0": (stalled(0, EVALUATE, 600),), "n1": (stalled(1, EVALUATE, 600),)},
                  {"n0": (stalled(0, COLLECTIVE + "gradients", HT + 1, step_s=20),),
                   "n1": (stalled(1, COMPUTE, HT + 1, step_s=20),)},
                  {"n0": (stalled(0, COMPUTE, 600),), "n1": (stalled(1, DATA, 600),)}):
        j.ranks = ranks
        j.tick(1, "n0", "n1")
        assert j.record.phase == "running" and not j.hub.failures, ranks


def shrunk(nodes: int = 3, **restarts: Any) -> Job:
    """A job of ``nodes`` nodes, no spare, min_nodes 2: n2 falls silent, is lost, and attempt 1 starts on the others
    (the record as the hub left it that second). n2's node then comes back with no trainer running."""
    j = Job(plan(nodes=nodes, restarts={"min_nodes": 2, **restarts}))
    j.stepping = True
    others = [f"n{i}" for i in range(nodes) if i != 2]
    j.tick(3, "n2", *others)
    while j.record.attempt == 0:
        assert j.now < 1000 + 3 + 2 * HT, j.log
        j.tick(1, *others)
    assert list(j.record.assignment) == others and "n2" in j.record.lost and j.record.restarts == 1
    j.trainers["n2"] = dataclasses.replace(j.trainers["n2"], state=TrainerState.EXITED, rc=-9)
    return j


def test_a_lost_node_that_answers_again_joins_the_smaller_world_at_once_and_no_restart_is_counted() -> None:
    """max_restarts 1, used by the loss: the grow needs none. n2 takes the next rank, n0 and n1 keep theirs, and the
    record holds the leave, then the join."""
    j = shrunk(max_restarts=1)
    j.starting.add("n1")
    j.tick(1, "n0", "n1", "n2")  # every trainer of attempt 1 runs, n2 is back, but n1's has not taken a step yet
    assert j.record.attempt == 1 and "n2" not in j.record.lost and "n2 answered again" in j.log
    j.starting.clear()
    j.tick(1, "n0", "n1", "n2")  # it has: the grow comes in that tick, the attempt's settling time or not
    assert j.hub.timings.settle > 1
    assert j.record.attempt == 2 and j.record.phase == "running" and j.record.restarts == 1
    assert j.record.assignment == {"n0": 0, "n1": 1, "n2": 2}
    assert j.record.world_urls == ("10.9.0.10", "10.9.0.11", "10.9.0.12")
    cause = j.record.cause
    assert cause is not None and (cause.node, cause.kind, cause.detect_s) == ("n2", Kind.JOINED, 0.0)
    assert cause.reason == "n2 joins the world: 2 nodes -> 3" and j.record.attempts[2].stopped_at is None
    left, joined = j.record.world_changes
    assert (left.attempt, left.left, left.joined, left.cause) == (1, ("n2",), (), Kind.LOST)
    assert (joined.attempt, joined.left, joined.joined, joined.before, joined.after, joined.cause) == (
        2, (), ("n2",), 2, 3, Kind.JOINED)
    assert joined.at == j.record.attempts[2].started_at
    assert "attempt 2: n2 joins the world: 2 nodes -> 3" in j.log
    assert j.record.goodput is not None and j.record.goodput.failures == 1  # the loss; a grow is no failure
    j.tick(2 * j.hub.timings.settle, "n0", "n1", "n2")
    assert j.record.attempt == 2  # full again: nothing to grow


def test_a_node_back_joins_only_once_its_standby_has_done_its_imports_the_world_training_on_meanwhile() -> None:
    """n2 answers again with no standby ready (its node starts one: an interpreter and torch to import): the world of
    two goes on training, with no attempt and nobody parked, until n2 says its standby waits; then n2 joins at once.
    Without restart in place there are no standbys, and the joiner starts a new process as any attempt does."""
    j = shrunk()
    j.importing.add("n2")
    j.tick(j.hub.timings.settle + 5, "n0", "n1", "n2")
    assert j.record.attempt == 1 and j.record.phase == "running" and "n2" not in j.record.lost
    j.importing.clear()
    j.tick(1, "n0", "n1", "n2")
    assert j.record.attempt == 2 and j.record.assignment == {"n0": 0, "n1": 1, "n2": 2}
    cold = shrunk(in_place=False)
    cold.importing.add("n2")
    cold.tick(cold.hub.timings.settle + 1, "n0", "n1", "n2")
    assert cold.record.attempt == 2 and cold.record.assignment == {"n0": 0, "n1": 1, "n2": 2}


def test_no_grow_while_a_trainer_of_the_attempt_does_not_run_yet_nor_while_a_member_is_not_heard() -> None:
    """n1's node has not reported its trainer of attempt 1 running: the world grows only once it does and the trainer
    has taken a step (a trainer still starting could not go on in place); nor once n1 has not been heard for the lease
    (it may be going: the hub names it lost only later)."""
    j = shrunk()
    j.tick(j.hub.timings.settle + 3, "n0", "n2")
    assert j.record.attempt == 1 and "n2" not in j.record.lost
    j.tick(1, "n0", "n1", "n2")
    assert j.record.attempt == 2 and j.record.assignment == {"n0": 0, "n1": 1, "n2": 2}
    quiet = shrunk(nodes=5)  # n1 falls quiet while n2 is still away: the other three keep the majority
    quiet.tick(1, "n0", "n1", "n3", "n4")
    quiet.tick(quiet.hub.timings.lease + 1, "n0", "n3", "n4")
    quiet.tick(1, "n0", "n2", "n3", "n4")  # n2 is back
    assert quiet.record.attempt == 1 and quiet.record.lost == {} and quiet.record.phase == "running"
    quiet.tick(1, "n0", "n1", "n2", "n3", "n4")
    assert quiet.record.attempt == 2 and quiet.record.assignment == {"n0": 0, "n1": 1, "n3": 2, "n4": 3, "n2": 4}
