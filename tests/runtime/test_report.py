"""The follow's words (trainer.runtime.report) say what happens to the job: an attempt stopping, the next one
starting, after what, detected how fast; the trainer's own failure message (a traceback's last line) is not the
news."""

from __future__ import annotations

import dataclasses
from typing import Any

from tests.runtime.test_plan import job, plans
from tests.runtime.test_records import a_record
from trainer.runtime import report
from trainer.runtime.job.hub import new_record
from trainer.runtime.job.record import (
    Cause,
    End,
    EndState,
    Failure,
    JobRecord,
    Kind,
    NodeTimeline,
    Phase,
    Start,
    WorldChange,
)

FAILED = {"state": "failed", "epoch": 3, "epochs": 30, "step": 121, "steps_per_epoch": 40,
          "message": "RuntimeError: [../third_party/gloo/transport/tcp/pair.cc:534] Connection closed by peer GLHF!"}
RUNNING = {**FAILED, "state": "running", "message": ""}


def status(record: JobRecord, progress: dict[str, Any] | None) -> dict[str, Any]:
    return {"state": "running", "mode": "hub", "record": record.to_json(), "progress": progress,
            "watch": {"quorum": {"needed": 2}, "lease": 2.0, "members": {
                "n0": {"heard_ago": 0.2}, "n1": {"heard_ago": 0.4}, "n2": {"heard_ago": 0.1}}}}


def test_a_restart_is_said_in_the_runtimes_words_not_the_trainers_traceback() -> None:
    restarting = report.progress_line(status(a_record(), FAILED))  # the new attempt's trainer has not written yet
    assert restarting.startswith("restarting (attempt 2 of 4): n1 killed, detected in 1.0 s; all 3 nodes heard")
    assert "GLHF" not in restarting and "RuntimeError" not in restarting
    training = report.progress_line(status(a_record(), RUNNING))
    assert training.startswith("running: epoch 3/30 done; step 121/1200")
    assert "; attempt 2 of 4, after n1 killed (detected in 1.0 s); all 3 nodes heard" in training


def test_an_attempt_stopping_and_a_wait_are_said_with_the_failure_and_its_detection() -> None:
    first = Failure("n2", Kind.FROZEN, "its trainer (pid 7) is frozen: no heartbeat for 61 s", 1.7e9 + 100)
    stopping = a_record(phase=Phase.STOPPING, first_failure=first, detected_at=1.7e9 + 103.8)
    line = report.progress_line(status(stopping, FAILED))
    assert line.startswith("stopping (attempt 2 of 4): n2 frozen, detected in 3.8 s: its trainer (pid 7) is frozen")
    assert "GLHF" not in line
    waiting = dataclasses.replace(stopping, phase=Phase.WAITING, waiting="n2 was lost; no spare: waiting up to 300 s")
    assert report.progress_line(status(waiting, FAILED)).startswith(
        "waiting (attempt 2 of 4): n2 was lost; no spare: waiting up to 300 s")
    failed = dataclasses.replace(stopping, phase=Phase.ENDED, end=End(EndState.FAILED, "n2 failed first: ...", first))
    assert report.progress_line(status(failed, FAILED)) == "the job failed: n2 failed first: ..."
    done = dataclasses.replace(failed, end=End(EndState.FINISHED, "attempt 1 trained to the end on every node", None))
    assert report.progress_line(status(done, {**RUNNING, "state": "finished"})).startswith("finished: epoch 3/30")


def test_the_controllers_reports_read_the_record_through_its_schema() -> None:
    states = {"n0": status(a_record(), RUNNING), "n1": {"state": "running", "mode": "member",
                                                        "record": {"version": "not a record"}}}
    assert report.hub_of(states["n0"]) == "n0" and report.hub_of(states["n1"]) == ""  # unreadable: no hub named
    assert report.rank0_of(states) == "n0" and report.freshest(states) is states["n0"]
    assert report.attempt_lines(a_record().to_json()) == [
        "attempt 1: n1 killed (its trainer was killed by signal 9 (SIGKILL)); detected after 1.0 s at step 120; "
        "ranks n0=0, n1=1"]
    ended = a_record(phase=Phase.ENDED, end=End(EndState.STOPPED, "stopped by user: stop-training.yml", None))
    end = report.end_report({"n0": {**status(ended, RUNNING), "state": "stopped"}})
    assert end["state"] == "stopped" and end["message"].startswith("The job stopped: stopped by user")
    assert report.job_end(status(ended, None)) == ended.end


def test_every_attempts_timeline_is_said_phase_after_phase() -> None:
    """training-status.yml's timeline of each attempt: the launch's, and a restart's from the failure to every node's
    first step, each phase after the one before, with how each node's trainer started and why not in place."""
    wall = 1.7e9
    launch = NodeTimeline(Start.PROCESS, "", wall + 0.1, wall + 4.1, wall + 5.0, wall + 5.2, wall + 6.0)
    record = a_record()
    first, again = record.attempts
    stuck = dataclasses.replace(launch, first_step=None, killed="its trainer did not stop within the 15 s stop grace: "
                                "killed", flight=("/j/flight/0/rank_1",))
    first = dataclasses.replace(first, nodes={"n0": launch, "n1": stuck})
    assert again.cause is not None
    cause = dataclasses.replace(again.cause, at=wall + 60, detected_at=wall + 61)
    survivor = NodeTimeline(Start.IN_PLACE, "", wall + 62.0, wall + 62.0, wall + 62.9, wall + 63.2, wall + 63.5,
                            step_before=wall + 59.8)  # its last step before the failure
    standby = NodeTimeline(Start.STANDBY, "its trainer was killed by signal 9 (SIGKILL) (attempt 0)", wall + 62.1,
                           wall + 62.1, wall + 62.9, wall + 63.2, wall + 63.6)
    again = dataclasses.replace(again, cause=cause, stopped_at=wall + 61.5, started_at=wall + 61.9,
                                nodes={"n1": standby, "n0": survivor})
    lines = report.timeline_lines(dataclasses.replace(record, attempts=(first, again)).to_json())
    assert lines == [
        "attempt 0 (s): the launch; n0 process: started +0.1, imported +4.0, group +0.9, checkpoint +0.2, first step "
        "+0.8; n1 process: started +0.1, imported +4.0, group +0.9, checkpoint +0.2, first step ?, its trainer did "
        "not stop within the 15 s stop grace: killed, flight recorder: /j/flight/0/rank_1",
        "attempt 1 (s): failure, named +1.0, over on every node +0.5, decided +0.4; n0 in place: started +0.1, "
        "imported +0.0, group +0.9, checkpoint +0.3, first step +0.3, paused 3.7 s since its last step before; n1 "
        "standby (its trainer was killed by signal 9 "
        "(SIGKILL) (attempt 0)): started +0.2, imported +0.0, group +0.8, checkpoint +0.3, first step +0.4; training "
        "again 3.6 s after the failure"]
    ended = dataclasses.replace(record, attempts=(first, again), phase=Phase.ENDED,
                                end=End(EndState.FAILED, "n1 failed first: ...", None))
    message = report.end_report({"n0": {**status(ended, RUNNING), "state": "failed"}})["message"]
    assert f"  {lines[1]}" in message.splitlines()


def test_a_world_that_shrank_is_said_in_the_follow_the_status_and_the_end() -> None:
    launch = new_record(plans(job(["/home/a", "/home/b", "/home/c"]))["n0"], 1.7e9)
    cause = Cause("n1", Kind.LOST, "it stopped answering the hub", 1.7e9 + 60, detected_at=1.7e9 + 64, detect_s=4.0,
                  failed_step=120)
    smaller = {"n0": 0, "n2": 1}
    trained = NodeTimeline(Start.PROCESS, "", 1.7e9, 1.7e9 + 4.0, 1.7e9 + 5.0, 1.7e9 + 5.2, 1.7e9 + 5.5,
                           micro_batches=1)
    first = dataclasses.replace(launch.attempts[0], nodes={"n0": trained, "n1": trained, "n2": trained})
    again = dataclasses.replace(first, attempt=1, started_at=1.7e9 + 66, cause=cause, assignment=smaller,
                                nodes={"n0": dataclasses.replace(trained, micro_batches=None)})  # n2 has not said
    change = WorldChange(attempt=1, at=1.7e9 + 66, left=("n1",), before=3, after=2, cause=Kind.LOST)
    record = launch.changed(attempt=1, restarts=1, assignment=smaller, attempts=(first, again),
                            world_changes=(change,))
    assert JobRecord.read(record.to_json()) == record
    assert report.attempt_lines(record.to_json())[0].endswith("3 nodes -> 2, accumulation 1 -> ?; ranks n0=0, n2=1")
    again = dataclasses.replace(again, nodes={"n0": dataclasses.replace(trained, micro_batches=2)})
    record = record.changed(attempts=(first, again))
    assert JobRecord.read(record.to_json()) == record
    said = "n1 left the world (lost, no spare): 3 nodes -> 2, accumulation 1 -> 2"
    assert report.attempt_lines(record.to_json()) == [
        f"attempt 1: n1 lost (it stopped answering the hub); detected after 4.0 s at step 120; {said}; "
        "ranks n0=0, n2=1"]
    world = "world: 2 of the launch's 3 nodes (n1 left at attempt 1)"
    assert world in report.progress_line(status(record, RUNNING))
    assert world in report.summary_lines(status(record, RUNNING))
    ended = record.changed(phase=Phase.ENDED, end=End(EndState.FINISHED, "attempt 1 trained to the end", None))
    end = report.end_report({"n0": {**status(ended, RUNNING), "state": "finished"}})
    assert world in end["summary"] and said in end["restarts"][0]


def test_a_world_that_grew_back_is_said_as_one_that_shrank() -> None:
    """n1 left at attempt 1 and joined again at attempt 2 (a grow, no failure: it counts toward no limit, so the
    attempts' count grows with it)."""
    launch = new_record(plans(job(["/home/a", "/home/b", "/home/c"]))["n0"], 1.7e9)
    lost = Cause("n1", Kind.LOST, "it stopped answering the hub", 1.7e9 + 60, detected_at=1.7e9 + 64, detect_s=4.0,
                 failed_step=120)
    joined = Cause("n1", Kind.JOINED, "n1 joins the world: 2 nodes -> 3", 1.7e9 + 90, detected_at=1.7e9 + 90,
                   failed_step=150)
    smaller, full = {"n0": 0, "n2": 1}, {"n0": 0, "n2": 1, "n1": 2}
    first = launch.attempts[0]
    shrink = dataclasses.replace(first, attempt=1, started_at=1.7e9 + 66, cause=lost, assignment=smaller)
    back = NodeTimeline(Start.PROCESS, "", 1.7e9 + 90.1, 1.7e9 + 94.0, 1.7e9 + 95.0, 1.7e9 + 95.2, 1.7e9 + 95.5,
                        micro_batches=1)
    stayed = NodeTimeline(Start.IN_PLACE, "", 1.7e9 + 90.2, 1.7e9 + 90.2, 1.7e9 + 95.0, 1.7e9 + 95.2, 1.7e9 + 95.4,
                          micro_batches=1)
    shrink = dataclasses.replace(shrink, nodes={"n0": dataclasses.replace(stayed, micro_batches=2)})
    grown = dataclasses.replace(first, attempt=2, started_at=1.7e9 + 90, cause=joined, assignment=full,
                                nodes={"n1": back, "n0": stayed, "n2": stayed})
    changes = (WorldChange(attempt=1, at=1.7e9 + 66, left=("n1",), before=3, after=2, cause=Kind.LOST),
               WorldChange(attempt=2, at=1.7e9 + 90, left=(), before=2, after=3, cause=Kind.JOINED, joined=("n1",)))
    record = launch.changed(attempt=2, restarts=1, assignment=full, attempts=(first, shrink, grown),
                            world_changes=changes)
    assert JobRecord.read(record.to_json()) == record
    assert report.attempt_lines(record.to_json())[1] == (
        "attempt 2: the world grew at step 150; n1 joined the world: 2 nodes -> 3, accumulation 2 -> 1; ranks n0=0, "
        "n2=1, n1=2")
    world = "world: 3 of the launch's 3 nodes (n1 left at attempt 1; n1 joined at attempt 2)"
    assert world in report.summary_lines(status(record, RUNNING))
    assert report.progress_line(status(record, None)).startswith(
        "growing (attempt 3 of 5): n1 joins the world: 2 nodes -> 3; " + world)
    assert "; attempt 3 of 5, after n1 joined; " + world in report.progress_line(status(record, RUNNING))
    timeline = report.timeline_lines(record)[2]
    assert timeline.startswith("attempt 2 (s): n1 joins the world: 2 nodes -> 3; n0 in place: started +0.2, ")
    assert "; n1 process: started +0.1, imported +3.9, group +1.0, checkpoint +0.2, first step +0.3; " in timeline
    assert timeline.endswith("; training again 5.5 s after the grow")
