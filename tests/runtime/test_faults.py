"""The job heals itself, on real supervisors with stand-in trainers on loopback (tests/runtime/loopback.py): a killed
trainer, a frozen one, a node lost with a spare to replace it, a node cut off and back without one, a node lost
without one leaving the world (min_nodes), the hub's node
lost (a new hub, rank 0 on the node with the second copy), a preemption. Seconds each; the slow lane runs the same on a
cluster with the real trainer (tests/cluster/test_resilience.py).

Each test asserts where the job resumed, not only that it ended: the stand-in with rank 0 records what its supervisor
told it ($VIDCLUSTER_ATTEMPT), the step it resumed from and the copy it read; and how each node's trainer came to the
next attempt (restart in place, the default: a survivor goes on in its process, a node that lost its trainer starts
the attempt in its standby), with its phases on record, and every rank's final "weights" those of an uninterrupted
run to the same step."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.runtime.loopback import NET, WATCH, Job, loopback, wait_until
from tests.runtime.standin import trained
from trainer.runtime import layout
from trainer.runtime.job.record import EndState, JobRecord, Kind, Start
from trainer.runtime.job.timing import HANG_FLOOR_S

__all__ = ["loopback"]
T = WATCH["heartbeat_timeout"]
CKPT = 5  # the stand-in's steps between two checkpoints


def started(make: Callable[..., Job], nodes: int, spares: int = 0, at_step: int = 12, **kwargs: object) -> Job:
    """A job whose every member runs, its rank 0 at ``at_step`` at least, every trainer beating."""
    job = make(nodes, spares, **kwargs)
    job.start_all()
    wait_until(lambda: job.step("n0") >= at_step, 60, f"rank 0 at step {at_step}", job.logs)
    trainers = job.names[:nodes]
    wait_until(lambda: all(job.beating(name) for name in trainers), 30, "every trainer beating", job.logs)
    return job


def resumed_from_a_checkpoint(job: Job, rank0: str) -> dict[str, object]:
    """The restarted attempt as the new rank 0 saw it: it read its own node's copy of a checkpoint past step 0."""
    [attempt] = job.attempts(rank0)
    assert attempt["read"] == str(job.run_file(rank0, "ckpt.json")), attempt
    assert isinstance(attempt["resumed_step"], int) and attempt["resumed_step"] >= CKPT, attempt  # not from scratch
    assert attempt["resumed_step"] % CKPT == 0 or attempt["cause"] == Kind.PREEMPTED, attempt
    return attempt


def uninterrupted(steps: int) -> str:
    """The stand-in's "weights" after ``steps`` steps of an uninterrupted run."""
    weights = ""
    for step in range(1, steps + 1):
        weights = trained(weights, step)
    return weights


def exact(job: Job, *nodes: str) -> None:
    """Every rank of the last attempt ended with the weights of an uninterrupted run to its last step."""
    ends = [job.weights(name) for name in nodes]
    assert sorted(end["rank"] for end in ends) == list(range(len(nodes))), ends
    for end in ends:
        assert end["weights"] == uninterrupted(end["step"]), (end, nodes)


def came(record: JobRecord, attempt: int = 1) -> dict[str, tuple[Start, str]]:
    """How each node's trainer came to ``attempt``, and why not in place; each node's phases of that attempt and of
    the one before on record (a trainer that ended, killed or lost, keeps its phases there), in order."""
    entry = record.attempts[attempt]
    assert entry.cause is not None and entry.stopped_at is not None
    assert entry.cause.at <= entry.cause.detected_at <= entry.stopped_at <= entry.started_at, entry
    for each in record.attempts[attempt - 1:attempt + 1]:
        for node, timeline in each.nodes.items():
            phases = [timeline.started, timeline.imported, timeline.group, timeline.checkpoint, timeline.first_step]
            assert None not in phases and phases == sorted(phases) and each.started_at <= timeline.started, (node, each)
        assert each.nodes.keys() == each.assignment.keys(), each
    return {node: (timeline.start, timeline.fallback) for node, timeline in entry.nodes.items()}


def test_a_killed_trainer_is_restarted_on_the_same_nodes_from_the_newest_checkpoint(loopback: Callable[..., Job]
                                                                                      ) -> None:
    job = started(loopback, 2)
    trainer = job.state("n1").trainer.pid
    assert trainer is not None
    wait_until(lambda: job.standby("n1"), 30, "n1's standby", job.logs)
    signal_at = time.time()
    os.kill(trainer, signal.SIGKILL)
    record = job.ended()
    assert record.end is not None and record.end.state == EndState.FINISHED, job.logs()
    assert record.restarts == 1 and record.assignment == {"n0": 0, "n1": 1}
    cause = record.attempts[1].cause
    assert cause is not None and (cause.node, cause.kind, cause.rc) == ("n1", Kind.KILLED, -9)
    assert 0 <= cause.detect_s < T and cause.at >= signal_at - 1  # its supervisor saw the exit at once
    attempt = resumed_from_a_checkpoint(job, "n0")
    assert attempt["failed_step"] == cause.failed_step and attempt["steps_lost"] == cause.failed_step - attempt[
        "resumed_step"]
    assert -CKPT < attempt["steps_lost"] <= 2 * CKPT  # what was trained since the checkpoint, and no more
    assert job.step("n0") == attempt["resumed_step"] + 10 and trainer not in job.processes("n1")
    # n0 went on in place, n1's next attempt ran in its standby; both end as an uninterrupted run would.
    assert came(record) == {"n0": (Start.IN_PLACE, ""),
                            "n1": (Start.STANDBY, "its trainer was killed by signal 9 (SIGKILL) (attempt 0)")}
    assert attempt["how"] == "in place" and record.attempts[0].nodes["n0"].start == Start.PROCESS
    exact(job, "n0", "n1")
    # n1's supervisor reported over one connection all along, through both attempts: each side of a link counts its
    # messages (a side that did not would break the link at its second message, and every report would reconnect).
    watch = json.loads((Path(job.folders["n0"]) / layout.WATCH_FILE).read_text())
    assert watch["members"]["n1"]["links"] == 1, watch["members"]


def test_a_frozen_trainer_is_caught_by_its_heartbeat_and_killed(loopback: Callable[..., Job]) -> None:
    job = started(loopback, 2)
    trainer = job.state("n0").trainer.pid
    assert trainer is not None
    os.kill(trainer, signal.SIGSTOP)  # frozen, not dead: only its silence can tell
    record = job.ended()
    assert record.end is not None and record.end.state == EndState.FINISHED, job.logs()
    cause = record.attempts[1].cause
    assert cause is not None and (cause.node, cause.kind) == ("n0", Kind.FROZEN)
    assert T <= cause.detect_s <= T + 4  # the heartbeat timeout, and a report or two
    resumed_from_a_checkpoint(job, "n0")
    ways = came(record)
    assert ways == {"n0": (Start.STANDBY, "its trainer froze (attempt 0)"), "n1": (Start.IN_PLACE, "")}
    exact(job, "n0", "n1")


def test_a_lost_node_is_replaced_by_the_spare_in_its_rank(loopback: Callable[..., Job]) -> None:
    job = started(loopback, 2, spares=1)
    job.lose("n1")
    record = job.ended()
    assert record.end is not None and record.end.state == EndState.FINISHED, job.logs()
    assert record.assignment == {"n0": 0, "n2": 1} and "n1" in record.lost and record.restarts == 1
    cause = record.attempts[1].cause
    assert cause is not None and (cause.node, cause.kind) == ("n1", Kind.LOST)
    # Its peer's collective broke at once (the stand-in parked): the hub named the attempt's failure then, and named
    # its cause, the lost node, once it had been silent for the loss time.
    assert 0 <= cause.detect_s <= T + 4
    assert "n2 replaces n1" in job.log("n0")
    resumed_from_a_checkpoint(job, "n0")
    assert came(record) == {"n0": (Start.IN_PLACE, ""), "n2": (Start.STANDBY, "")}  # the spare's standby, at once
    exact(job, "n0", "n2")


def test_a_node_cut_off_without_a_spare_is_waited_for_and_welcomed_back(loopback: Callable[..., Job]) -> None:
    """Its supervisor and trainer stopped for longer than the heartbeat timeout (a machine that hung, a cable out and
    back): the hub counts it lost and waits; back, it finds the hub it lost still there, and the job goes on with it."""
    job = started(loopback, 2)
    job.signal("n1", signal.SIGSTOP)
    wait_until(lambda: "n1" in job.record().lost, 30, "the hub to count n1 lost", job.logs)
    job.signal("n1", signal.SIGCONT)
    record = job.ended()
    assert record.end is not None and record.end.state == EndState.FINISHED, job.logs()
    assert record.assignment == {"n0": 0, "n1": 1} and record.lost == {} and record.restarts == 1
    assert record.hub == "n0" and record.term == 0  # n1 came back to the hub it had lost, and took no term
    assert "n1 answered again" in job.log("n0")
    cause = record.attempts[1].cause
    assert cause is not None and (cause.node, cause.kind) == ("n1", Kind.LOST)
    resumed_from_a_checkpoint(job, "n0")
    # n0 went on in place; n1, back, left its attempt in place too: its supervisor, stopped as long, does not take its
    # trainer's silence meanwhile for a freeze.
    assert came(record) == {"n0": (Start.IN_PLACE, ""), "n1": (Start.IN_PLACE, "")}
    exact(job, "n0", "n1")


def test_a_lost_node_without_a_spare_leaves_the_world_and_the_job_goes_on_at_once_on_the_others(
        loopback: Callable[..., Job]) -> None:
    """3 nodes, no spare, min_nodes 2: the job restarts on the two left (no node_wait) and trains to the end."""
    job = started(loopback, 3, node_wait=60.0, min_nodes=2)
    job.lose("n1")
    record = job.ended()
    assert record.end is not None and record.end.state == EndState.FINISHED, job.logs()
    assert record.assignment == {"n0": 0, "n2": 1} and "n1" in record.lost and record.restarts == 1
    assert record.world_urls == (f"{NET}.10", f"{NET}.12")
    entry = record.attempts[1]
    assert entry.cause is not None and (entry.cause.node, entry.cause.kind) == ("n1", Kind.LOST)
    assert entry.stopped_at is not None and entry.started_at - entry.stopped_at < 5  # no wait for n1 (60 s)
    [change] = record.world_changes
    assert (change.attempt, change.left, change.before, change.after, change.cause) == (1, ("n1",), 3, 2, Kind.LOST)
    assert change.at == entry.started_at
    assert "n1 leaves the world, no spare taking its rank: 3 nodes -> 2" in job.log("n0")
    resumed_from_a_checkpoint(job, "n0")
    assert came(record) == {"n0": (Start.IN_PLACE, ""), "n2": (Start.IN_PLACE, "")}
    exact(job, "n0", "n2")


def test_the_hubs_node_lost_a_new_hub_waits_out_the_old_attempt_and_rank_0_moves_to_the_second_copy(
        loopback: Callable[..., Job]) -> None:
    job = started(loopback, 2, spares=1)
    copy_step = job.step("n0")
    job.lose("n0")
    record = job.ended()
    assert record.end is not None and record.end.state == EndState.FINISHED, job.logs()
    assert record.hub == "n1" and record.term == 1 and "n0" in record.lost
    assert record.assignment == {"n1": 0, "n2": 1}  # the node with the second copy is rank 0 now
    cause = record.attempts[1].cause
    assert cause is not None and (cause.node, cause.kind) == ("n0", Kind.LOST)
    # The new hub counted the old one lost (``at``) the loss time before it took over, and started no attempt
    # before the old attempt's last process was surely gone (trainer.runtime.job.timing).
    took_over = cause.at + T
    timings = job.plans["n1"].timings
    assert record.attempts[1].started_at - took_over >= timings.takeover_wait - 0.05, (record, timings)
    attempt = resumed_from_a_checkpoint(job, "n1")  # the surviving copy, on n1
    assert attempt["resumed_step"] >= copy_step - CKPT - 2  # the copy kept up with rank 0
    assert "this node is the job's hub now (term 1; n0 was lost)" in job.log("n1")
    assert came(record) == {"n1": (Start.IN_PLACE, ""), "n2": (Start.STANDBY, "")}
    exact(job, "n1", "n2")


@pytest.mark.parametrize("preempted", [("n0", "n1"), ("n1",)], ids=["every-node", "one-node"])
def test_a_preemption_checkpoints_and_the_restart_loses_no_step(loopback: Callable[..., Job],
                                                                preempted: tuple[str, ...]) -> None:
    # Every node, or one: the other's trainer checkpoints at the same step (the agreement, and its supervisor's
    # SIGUSR1: trainer.runtime.host.node.stop_signal; test_node tells the second apart).
    job = started(loopback, 2)
    for name in preempted:  # what a scheduler or a cloud's spot notice sends: SIGTERM to the supervisor (its trainer,
        os.kill(job.state(name).pid, signal.SIGTERM)  # in a session of its own, gets SIGUSR1 from it)
    record = job.ended()
    assert record.end is not None and record.end.state == EndState.FINISHED, job.logs()
    cause = record.attempts[1].cause
    assert cause is not None and cause.kind == Kind.PREEMPTED and record.restarts == 1
    attempt = resumed_from_a_checkpoint(job, "n0")
    assert attempt["steps_lost"] == 0 and attempt["resumed_step"] == cause.failed_step
    assert all("the trainer exited with status 75" in job.log(name) for name in job.names), job.logs()
    preempted = "its trainer checkpointed and stopped when asked (exit status 75) (attempt 0)"
    assert came(record) == {"n0": (Start.STANDBY, preempted), "n1": (Start.STANDBY, preempted)}
    exact(job, "n0", "n1")


def test_at_the_default_watch_a_rank_hung_in_its_step_is_named_and_the_job_restarted_within_30_s(
        loopback: Callable[..., Job]) -> None:
    # The job description's own watch: a 60 s heartbeat timeout, members reporting every 10 s, a 15 s stop grace.
    # n1's rank hangs in the compute of step 20 and beats on: named at the 15 s floor (TIMEOUT_SECONDS is minutes).
    job = started(loopback, 2, env={"STANDIN_HANG": "0:20:1"}, watch={})
    record = job.ended()
    assert record.end is not None and record.end.state == EndState.FINISHED, job.logs()
    cause = record.attempts[1].cause
    assert cause is not None and (cause.node, cause.kind) == ("n1", Kind.HUNG), job.logs()
    assert cause.reason.startswith("its rank 1 hung in compute, 19 steps into its attempt: "), cause.reason
    assert HANG_FLOOR_S <= cause.detect_s <= HANG_FLOOR_S + 5, cause
    assert record.attempts[1].started_at - cause.at < 30, (record.attempts[1].started_at - cause.at, cause)
    assert came(record) == {"n0": (Start.IN_PLACE, ""), "n1": (Start.STANDBY, "its trainer hung (attempt 0)")}
    exact(job, "n0", "n1")


def test_a_rank_hung_in_its_step_is_named_by_its_progress_and_killed_and_the_job_restarts_in_seconds(
        loopback: Callable[..., Job]) -> None:
    # n1's rank hangs in the compute of step 20, beating on; n0 waits for it in the all-reduce. Nothing but their
    # progress tells: without the hub's hang detection the job waits for the collective's timeout (TIMEOUT_SECONDS).
    job = started(loopback, 2, env={"STANDIN_HANG": "0:20:1"})
    record = job.ended()
    assert record.end is not None and record.end.state == EndState.FINISHED, job.logs()
    cause = record.attempts[1].cause
    assert cause is not None and (cause.node, cause.kind) == ("n1", Kind.HUNG), job.logs()
    assert cause.reason.startswith("its rank 1 hung in compute, 19 steps into its attempt: "), cause.reason
    assert "while rank(s) 0 wait in a collective" in cause.reason, cause.reason
    # Named once its step had stalled for the floor (the heartbeat timeout, at the default hang factor), and the next
    # attempt started within 30 s of its last step.
    assert T <= cause.detect_s <= T + 4, cause
    assert record.attempts[1].started_at - cause.at < 30, record.attempts[1]
    resumed_from_a_checkpoint(job, "n0")
    # n1's trainer was killed at once (SIGKILL: it cannot leave), n0's left the attempt in place: no stop grace ran out.
    assert came(record) == {"n0": (Start.IN_PLACE, ""), "n1": (Start.STANDBY, "its trainer hung (attempt 0)")}
    assert [timeline.killed for timeline in record.attempts[0].nodes.values()] == ["", ""], record.attempts[0]
    # Before its SIGKILL it wrote its threads' stacks into n1's log: where it hung, and its heartbeat beating on.
    stacks = job.log("n1")
    assert re.search(r'Current thread 0x[0-9a-f]+ \(most recent call first\):\n  File ".*standin\.py", line \d+ in '
                     r"train_step\n", stacks), stacks[-3000:]
    assert re.search(r'  File ".*heartbeat\.py", line \d+ in _beat\n', stacks), stacks[-3000:]
    exact(job, "n0", "n1")
