"""Slow nodes and the job's goodput, decided by the hub (trainer.runtime.job.hub, .pace, .straggler, .goodput) driven
directly: members report their trainers' efforts (the step clock's sums, as their heartbeats carry them), time passes,
and the record says who was named, who replaced whom, and where the job's time went. No sockets, no processes."""

from __future__ import annotations

import dataclasses
import math
import random
import statistics
from pathlib import Path
from typing import Any

import pytest

from tests.runtime.test_hub import Job, plan, report
from trainer.runtime.job import goodput, pace, straggler
from trainer.runtime.job.pace import Beat, Effort, Pace, PaceBook
from trainer.runtime.job.policy import decide
from trainer.runtime.job.record import Attempt, Cause, Failure, Kind, Spent, WorldChange
from trainer.runtime.job.straggler import Rules, Treatment
from trainer.runtime.job.verdict import first_failure
from trainer.runtime.report import goodput_lines, straggler_words
from trainer.runtime.watch.messages import TrainerState

STEP_S = 0.05  # every node's time per step, unless slowed
RULES = {"threshold": 0.7, "window": 20, "action": "auto", "cooldown": 100}
HT = 12  # the heartbeat timeout: reports every 2 s, paces measured over 5 s windows (a quarter of the naming window)


def effort(steps: int, own: float, sync: float = 0.0, **more: Any) -> Effort:
    given = {"steps": steps, "data_s": 0.0, "compute_s": own, "sync_s": sync, "checkpoint_s": 0.0, "checkpoints": 0,
             "start_step": 0, "training_from": 1.7e9, "checkpoint_every_s": 0.0}
    return Effort(**{**given, **more})


class Paced(Job):
    """A job whose members' trainers take steps together, each node computing at its own pace (``slow``: node ->
    factor); every node's step takes as long as the slowest node's, the others wait for it in the all-reduce."""

    def __init__(self, nodes: int = 2, spares: int = 1, restarts: dict[str, Any] | None = None,
                 **rules: Any) -> None:
        super().__init__(plan(nodes, spares, stragglers={**RULES, **rules}, restarts=restarts or {},
                              watch={"heartbeat_timeout": HT}))
        self.slow: dict[str, float] = {}
        self.efforts: dict[str, Effort] = {}
        self.attempt_of: dict[str, int] = {}  # node -> the attempt its effort counts

    def report(self, *nodes: str) -> None:
        super().report(*nodes)
        attempt, assigned = self.record.attempt, self.record.assignment
        factor = max((self.slow.get(n, 1.0) for n in assigned), default=1.0)
        for node in nodes:
            trainer = self.trainers.get(node)
            if trainer is None or trainer.attempt != attempt or trainer.state != TrainerState.RUNNING:
                continue
            own = STEP_S * self.slow.get(node, 1.0)
            last = self.efforts.get(node)
            last = last if last is not None and self.attempt_of.get(node) == attempt else effort(0, 0.0)
            self.attempt_of[node] = attempt
            steps = round(1 / (STEP_S * factor))  # a second's steps: the slowest node sets everyone's pace
            self.efforts[node] = dataclasses.replace(last, steps=last.steps + steps,
                                                     compute_s=last.compute_s + steps * own,
                                                     sync_s=last.sync_s + steps * (STEP_S * factor - own))
            self.hub.heard(node, report(node, trainer, pace=Pace(attempt, self.efforts[node])), self.now)


def until_named(j: Paced, node: str, *reporting: str, most: float = 60) -> float:
    """Seconds until the hub names ``node`` a straggler (members report every second)."""
    for second in range(1, int(most)):
        j.tick(1, *reporting)
        if node in j.record.stragglers:
            return second
    raise AssertionError(f"{node} not named within {most} s: {j.log}")


def test_a_node_slow_for_the_window_is_named_and_swapped_for_the_spare_at_a_checkpoint() -> None:
    j = Paced()
    j.tick(30, "n0", "n1", "n2")
    assert j.record.stragglers == {} and j.record.phase == "running"  # equal paces: nobody is named
    j.slow["n1"] = 4.0  # from now on n1 takes four times as long per step; n0 waits for it
    took = until_named(j, "n1", "n0", "n1", "n2")
    span = j.hub.plan.stragglers.span(j.hub.timings.report_every)
    assert RULES["window"] <= took <= RULES["window"] + span + 1  # a whole window, and a measurement's lag at most
    named = j.record.stragglers["n1"]
    assert named.pace == pytest.approx(0.25, abs=0.02) and named.slow_for >= RULES["window"]
    assert named.replaced_by == "n2" and j.record.phase == "stopping"  # the spare is taken, the attempt stops
    first = j.record.first_failure
    assert first is not None and (first.node, first.kind) == ("n1", Kind.SLOW) and "0.25x" in first.reason
    assert any(line.startswith("n1 is a straggler: it trained at 0.25x") for line in j.log), j.log
    # every trainer stops (checkpointing at a common step: trainer.runtime.host.node.stop_signal); the spare takes n1's
    # rank, exactly as for a lost node
    j.tick(2, "n0", "n1", "n2")
    assert j.record.attempt == 1 and j.record.assignment == {"n0": 0, "n2": 1} and j.record.restarts == 1
    cause = j.record.cause
    assert cause is not None and (cause.node, cause.kind, cause.detect_s) == ("n1", Kind.SLOW, 0.0)
    assert j.record.stragglers["n1"].replaced_by == "n2" and j.record.stragglers["n1"].note == ""
    assert j.record.spent[0].attempt == 0 and j.record.goodput is not None
    assert "n1" not in j.hub._spares(j.now)  # idle and heard, but never a spare of this job again


def test_without_a_spare_a_straggler_is_named_and_trains_on() -> None:
    j = Paced(spares=0)
    j.tick(10, "n0", "n1")
    j.slow["n0"] = 3.0
    until_named(j, "n0", "n0", "n1")
    named = j.record.stragglers["n0"]
    assert named.replaced_by == "" and named.note == "no spare is free to replace it"
    assert j.record.phase == "running" and j.record.attempt == 0  # nothing stopped
    version = j.record.version
    j.tick(10, "n0", "n1")
    assert j.record.version == version  # named once: the record does not change at every report


@pytest.mark.parametrize(("rules", "note"), [
    ({"action": "report"}, "the straggler action is report"),
    ({"action": "replace"}, ""),
])  # fmt: skip
def test_the_action_decides(rules: dict[str, Any], note: str) -> None:
    j = Paced(**rules)
    j.tick(10, "n0", "n1", "n2")
    j.slow["n1"] = 3.0
    until_named(j, "n1", "n0", "n1", "n2")
    assert j.record.stragglers["n1"].note == note
    assert (j.record.phase == "stopping") == (note == "")


def test_a_dropped_straggler_leaves_the_world_without_the_spare_down_to_min_nodes() -> None:
    j = Paced(nodes=3, spares=1, action="drop", restarts={"min_nodes": 2})
    everyone = ("n0", "n1", "n2", "n3")
    j.tick(10, *everyone)
    j.slow["n0"] = 3.0
    until_named(j, "n0", *everyone)
    assert j.record.phase == "stopping" and j.record.stragglers["n0"].replaced_by == ""
    assert any(line.startswith("attempt 0: dropping straggler n0: every node checkpoints") for line in j.log), j.log
    j.tick(2, *everyone)
    assert j.record.attempt == 1 and j.record.assignment == {"n1": 0, "n2": 1}  # n3, the spare, stays idle
    [change] = j.record.world_changes
    assert (change.attempt, change.left, change.before, change.after, change.cause) == (1, ("n0",), 3, 2, Kind.SLOW)
    assert j.record.stragglers["n0"].note == "left the world (straggler action drop)"
    assert straggler_words(j.record).endswith(" s, left the world (straggler action drop)")
    j.slow["n1"] = 3.0  # another drop would leave 1 node, below min_nodes: named, it trains on
    until_named(j, "n1", *everyone)
    assert j.record.phase == "running" and j.record.stragglers["n1"].note == (
        "dropping it would leave 1 nodes, and the job trains on 2 at least (vidcluster_min_nodes)")
    assert j.record.attempt == 1  # the spare never took n0's rank, not even by a grow of the smaller world


def test_no_swap_flaps_one_per_node_and_a_cooldown_between_two() -> None:
    j = Paced(nodes=2, spares=2, cooldown=200)
    everyone = ("n0", "n1", "n2", "n3")
    j.tick(10, *everyone)
    j.slow["n1"] = 3.0
    until_named(j, "n1", *everyone)
    j.tick(2, *everyone)
    assert j.record.assignment == {"n0": 0, "n2": 1}
    j.slow["n2"] = 3.0  # the spare that came in is slow too: named, but the last swap was too recent
    until_named(j, "n2", *everyone)
    named = j.record.stragglers["n2"]
    assert named.replaced_by == "" and "the job's last swap was" in named.note and j.record.phase == "running"
    for _ in range(200):  # the cooldown passes: n2 goes, and n3 comes in, never n1 again
        j.tick(1, *everyone)
        if j.record.phase == "stopping":
            break
    assert j.record.stragglers["n2"].replaced_by == "n3"
    j.tick(2, *everyone)
    assert j.record.assignment == {"n0": 0, "n3": 1} and j.record.restarts == 2


def test_a_swap_needs_a_restart_left() -> None:
    j = Paced(restarts={"max_restarts": 0})
    j.tick(10, "n0", "n1", "n2")
    j.slow["n1"] = 3.0
    until_named(j, "n1", "n0", "n1", "n2")
    assert j.record.stragglers["n1"].note == "no restart left to swap it (0 of 0 used)"


def test_a_real_failure_while_a_swap_stops_the_attempt_is_named_instead() -> None:
    slow = Failure("n1", Kind.SLOW, "a straggler", at=10.0)
    killed = Failure("n0", Kind.KILLED, "its trainer was killed by signal 9 (SIGKILL)", at=11.0, rc=-9)
    assert first_failure([slow, killed]) == killed and first_failure([slow]) == slow


def test_the_policy_swaps_a_straggler_like_a_lost_node_and_keeps_it_without_a_spare() -> None:
    slow = Failure("node0", Kind.SLOW, "a straggler", at=1.0)
    common = {"previous": None, "assignment": {"node0": 0, "node1": 1, "node2": 2}, "lost": {}, "restarts_used": 0,
              "max_restarts": 3, "waited": False, "node_wait": 300, "min_nodes": 3}
    swapped = decide(first=slow, available=("spare",), **common)
    assert swapped.replaced == {"node0": "spare"}
    assert swapped.assignment == {"node1": 0, "spare": 1, "node2": 2}  # rank 0 to the node with the second copy
    kept = decide(first=slow, available=(), **common)
    assert kept.action == "restart" and kept.replaced == {} and kept.assignment == common["assignment"]


def test_a_nodes_pace_is_its_time_per_step_against_the_median_of_the_others() -> None:
    book = PaceBook(span=5)
    for second in range(0, 12):
        for node, own in (("a", 0.5), ("b", 0.55), ("c", 2.0)):
            book.heard(node, Pace(0, effort(2 * second, 2 * second * own, sync=0.0)), 100.0 + second)
    paces = book.paces(0, ["a", "b", "c"])
    assert paces["c"][0] == pytest.approx(0.525 / 2.0) and paces["a"][0] == pytest.approx(1.275 / 0.5)
    assert paces["c"][1] == 110.0  # measured over the window that ended then
    assert book.paces(1, ["a", "b", "c"]) == {}  # another attempt: nothing measured yet
    book.heard("a", Pace(1, effort(1, 0.5)), 200.0)  # a new attempt starts the node's measurement again
    assert "a" not in book.paces(0, ["a", "b", "c"])
    assert book.effort(0, ["a", "b", "c"]) == effort(22, 44.0)  # the slowest node's, as last reported


def test_the_median_of_the_others_is_the_median_without_the_node() -> None:
    rng = random.Random(7)
    for size in (1, 2, 3, 4, 5, 10, 11, 64):
        values = sorted(rng.choice((0.5, 1.0, rng.uniform(0.1, 3.0))) for _ in range(size))  # with ties
        for index in range(size):
            others = values[:index] + values[index + 1:]
            assert pace.median_without(values, index) == pytest.approx(statistics.median(others) if others else 0.0)


def test_a_nodes_effort_is_its_slowest_process_and_a_heartbeat_reads_back(tmp_path: Path) -> None:
    one, two = effort(10, 5.0, sync=3.0), effort(9, 8.0, sync=1.0, data_s=1.0)
    assert pace.node_effort([one], workers=2) is None  # one process has not counted yet
    node = pace.node_effort([one, two], workers=2)
    assert node is not None and (node.steps, node.own_s, node.sync_s, node.data_s) == (9, 9.0, 1.0, 1.0)
    path = tmp_path / "123"
    path.write_text(pace.beat_text(Beat(at=5.5, effort=two)))
    assert pace.read_beat(path) == Beat(at=5.5, effort=two)
    path.write_text("12.5")  # a heartbeat of another version: not read (the node sees no beat, not an error)
    assert pace.read_beat(path) is None


def test_straggler_settings_are_checked() -> None:
    with pytest.raises(ValueError, match=r"threshold 1\.2 must be between 0 and 1"):
        Rules(threshold=1.2, window=10, action=Treatment.AUTO, cooldown=0)
    rules = Rules(threshold=0.7, window=300, action=Treatment.AUTO, cooldown=0)
    assert rules.span(report_every=10) == 75 and Rules(0.7, 10, Treatment.AUTO, 0).span(report_every=10) == 20
    watch = straggler.Watch(dataclasses.replace(rules, action=Treatment.OFF))
    assert watch.observe({"a": (0.1, 0.0)}, now=1000) == {}


def test_goodput_adds_up_to_the_wall_time_across_failures() -> None:
    """A job of three attempts: launched at 0, first batch at 30; killed at 330 (detected at 333), trained again
    from 345 (a checkpoint 20 steps back); lost at 645, named at 660, trained again from 700; ends at 1000."""
    j = Paced()
    record = j.record
    first = effort(300, 200.0, sync=40.0, data_s=20.0, checkpoint_s=10.0, checkpoints=5, training_from=record.attempts[
        0].started_at + 30, checkpoint_every_s=60.0)
    t0 = record.attempts[0].started_at

    def attempt(n: int, kind: Kind, at: float, detected: float, failed: int) -> Attempt:
        cause = Cause("n1", kind, "...", t0 + at, detected_at=t0 + detected, detect_s=detected - at,
                      failed_step=failed)
        return dataclasses.replace(record.attempts[0], attempt=n, started_at=t0 + detected + 1, cause=cause)

    second = effort(300, 250.0, sync=20.0, data_s=20.0, checkpoint_s=10.0, checkpoints=5, start_step=280,
                    training_from=t0 + 345, checkpoint_every_s=60.0)
    third = effort(300, 250.0, sync=20.0, data_s=20.0, checkpoint_s=10.0, checkpoints=5, start_step=570,
                   training_from=t0 + 700, checkpoint_every_s=60.0)
    done = dataclasses.replace(record, attempts=(*record.attempts, attempt(1, Kind.KILLED, 330, 333, 300),
                                                 attempt(2, Kind.LOST, 645, 660, 580)), attempt=2,
                               spent=(Spent(0, first), Spent(1, second)))
    g = goodput.account(done, third, t0 + 1000)
    assert g.wall_s == 1000 and (g.startup_s, g.detection_s) == (30, 3 + 15) and g.restart_s == 12 + 40
    assert g.recomputed_s == pytest.approx(20 * 240 / 300 + 10 * 270 / 300, abs=0.1)  # steps trained twice
    parts = (g.trained_s, g.startup_s, g.detection_s, g.restart_s, g.recomputed_s, g.checkpoint_s, g.data_s,
             g.other_s)
    assert sum(parts) == pytest.approx(g.wall_s, abs=0.5) and g.other_s >= 0 and g.failures == 2
    # Young: sqrt(2 x 2 s per checkpoint x 500 s between failures) = 44.7 s; 60 s configured is close enough
    assert g.young_daly_s == pytest.approx(44.7, abs=0.1) and g.suggestion == ""
    assert "is far from" in goodput.suggestion(600.0, 44.7) and "CHECKPOINT_MINUTES 0)" in goodput.suggestion(0, 60)
    assert g.world_change_s == 0  # every attempt on the launch's world
    # The node lost at 645 left the world (no spare): that restart, 40 s, is also the world change's, within restarts.
    left = WorldChange(attempt=2, at=t0 + 660, left=("n1",), before=3, after=2, cause=Kind.LOST)
    shrunk = goodput.account(dataclasses.replace(done, world_changes=(left,)), third, t0 + 1000)
    assert shrunk == dataclasses.replace(g, world_change_s=40)
    assert "restarts 52s (world changes 40s)," in goodput_lines(shrunk)[0] and "world" not in goodput_lines(g)[0]


def test_each_part_of_goodput_comes_from_its_own_counters_and_a_straggler_swap_is_no_failure() -> None:
    """Launched at 0, first batch at 20; killed at 100 (named at 103), trained again from 115 after a checkpoint 20
    steps back; swapped out as a straggler at 200 (its checkpoint at the swap's step), trained again from 210; now 300.
    Each part is its own sum of the inputs (not only the remainder that makes them add up)."""
    record = Job(plan()).record
    t0 = record.attempts[0].started_at

    def after(n: int, kind: Kind, at: float, detected: float) -> Attempt:
        cause = Cause("n1", kind, "...", t0 + at, detected_at=t0 + detected, detect_s=detected - at)
        return dataclasses.replace(record.attempts[0], attempt=n, started_at=t0 + detected + 1, cause=cause)

    first = effort(100, 50.0, sync=10.0, data_s=5.0, checkpoint_s=4.0, checkpoints=2, training_from=t0 + 20,
                   checkpoint_every_s=60.0)
    second = effort(100, 40.0, sync=20.0, data_s=3.0, checkpoint_s=2.0, checkpoints=1, start_step=80,
                    training_from=t0 + 115, checkpoint_every_s=60.0)
    third = effort(50, 30.0, sync=5.0, data_s=1.0, start_step=180, training_from=t0 + 210, checkpoint_every_s=60.0)
    done = dataclasses.replace(record, attempts=(*record.attempts, after(1, Kind.KILLED, 100, 103),
                                                 after(2, Kind.SLOW, 200, 200)), attempt=2,
                               spent=(Spent(0, first), Spent(1, second)))
    g = goodput.account(done, third, t0 + 300)
    recomputed = 20 * (50.0 + 10.0) / 100  # the first attempt's last 20 steps, trained again by the second
    assert (g.wall_s, g.startup_s, g.detection_s, g.restart_s) == (300, 20, 3, (115 - 103) + (210 - 200)), g
    assert g.recomputed_s == recomputed, g
    trained = (50.0 + 10.0 - recomputed) + (40.0 + 20.0) + (30.0 + 5.0)  # computing and syncing
    assert (g.trained_s, g.checkpoint_s, g.data_s) == (trained, 4.0 + 2.0, 5.0 + 3.0 + 1.0), g
    assert g.other_s == 300 - (20 + 3 + 22 + recomputed + trained + 6 + 9), g
    # The kill is the one failure: Young's interval from 2 s per checkpoint and 300 s between failures.
    assert g.failures == 1 and g.young_daly_s == pytest.approx(math.sqrt(2 * (6.0 / 3) * 300 / 1), abs=0.1), g
