"""The Slurm batch step's decisions, alone: the record an allocation continues from (trainer/runtime/slurm/account.py),
when Slurm must requeue a job and whether that counts as a restart (trainer/runtime/job/requeue.py), the status while
the job is in Slurm's hands and the batch script (trainer/runtime/slurm/login.py). The whole thing runs on a local
Slurm cluster in tests/cluster/test_slurm.py (the slow lane)."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.runtime.test_plan import job, plans
from trainer.node_config import JobSpec
from trainer.runtime import layout, schema
from trainer.runtime.job.hub import new_record
from trainer.runtime.job.record import End, EndState, Failure, JobRecord, Kind, Phase
from trainer.runtime.job.requeue import Requeue, TimeLimit, cause, decide
from trainer.runtime.slurm.account import ACCOUNT_FILE, Next, SlurmError, continued
from trainer.runtime.slurm.allocation import Batch
from trainer.runtime.slurm.login import Outcome, Queue, batch_script, judged

HOMES = ["/home/u"] * 3


def ended(state: str, kind: str, restarts: int = 0, node: str = "n1") -> JobRecord:
    """A record whose attempt ended ``state``, its first failure of ``kind`` on ``node``, named 4 s after it, after
    rank 0 reported step 37."""
    first = Failure(node, Kind(kind), f"{node} went {kind}", 1000.0)
    return new_record(plans(job(HOMES))["n0"], 900.0).changed(
        restarts=restarts, detected_at=1004.0, failed_step=37, end=End(EndState(state), "why", first))


def requeue_cause(record: JobRecord, progress: dict[str, Any], time_limit: TimeLimit | None, batch_host: str,
                  max_restarts: int) -> tuple[dict[str, Any], bool] | None:
    """The batch step's decision after its step (no cancel), as (the cause as slurm.json holds it, counted) for a
    requeue, None when the end on record stands."""
    decided = decide(record=record, step=progress.get("step"), time_limit=time_limit, cancelled=False,
                     batch_host=batch_host, slurm_job="77", max_restarts=max_restarts, now=time.time())
    if isinstance(decided, Requeue):
        return schema.dump(decided.cause), decided.counted
    assert decided == record.end  # the end on record stands, as it is
    return None


def test_an_allocation_continues_the_record_of_the_one_before() -> None:
    first = plans(job(HOMES))["n0"]
    assert continued(first, None, 5.0) == new_record(first, 5.0)  # the launch's attempt 0
    launched = new_record(first, 900.0)
    before = launched.changed(attempt=2, restarts=1, attempts=(*launched.attempts,) * 3)
    why = cause("n1", Kind.LOST, "n1 went lost", 1000.0, 37, 1004.0)
    # The next allocation has other nodes: its ranks and rendezvous, the earlier attempts and restarts carried on.
    after = plans(job(["/home/u"] * 2, net="10.9.7"))["n0"]
    record = continued(after, Next(before, why, True), 2000.0)
    assert (record.attempt, record.restarts, record.phase, record.end) == (3, 2, Phase.RUNNING, None)
    assert record.attempts[:3] == before.attempts
    assert record.attempts[3].attempt == 3 and record.attempts[3].cause is not None
    assert (record.attempts[3].cause.node, record.attempts[3].cause.kind, record.attempts[3].cause.detect_s) == (
        "n1", Kind.LOST, 4.0)
    assert record.rendezvous.startswith("tcp://10.9.7.10:") and record.lost == {}
    assert continued(after, Next(before, why, False), 2000.0).restarts == 1


def test_only_what_the_allocation_cannot_fix_is_requeued() -> None:
    signal = TimeLimit(990.0, "the time limit is near")
    progress = {"step": 40}
    # The time limit: the job stopped at the agreed step; a requeue that does not count as a restart.
    why, counted = requeue_cause(ended("stopped", "stopped"), progress, signal, "n0", 3) or ({}, None)
    assert (why["kind"], why["failed_step"], counted) == ("preempted", 40, False)
    # A node lost with no spare: the hub's own detection time, counted, while restarts are left.
    why, counted = requeue_cause(ended("failed", "lost"), progress, None, "n0", 3) or ({}, None)
    assert (why["node"], why["kind"], why["detect_s"], why["failed_step"], counted) == ("n1", "lost", 4.0, 37, True)
    assert requeue_cause(ended("failed", "lost", restarts=3), progress, None, "n0", 3) is None
    # What a requeue cannot fix stands: a bad input, a finished job, a user's stop.
    assert requeue_cause(ended("failed", "rejected"), progress, None, "n0", 3) is None
    assert requeue_cause(ended("finished", "lost"), progress, signal, "n0", 3) is None
    assert requeue_cause(ended("stopped", "stopped"), progress, None, "n0", 3) is None
    # A step that ended without an end on record (its supervisors killed): counted.
    unended = new_record(plans(job(HOMES))["n0"], 900.0)
    why, counted = requeue_cause(unended, progress, None, "n0", 3) or ({}, None)
    assert (why["node"], why["kind"], counted) == ("n0", "lost", True) and why["at"] <= time.time()


def test_an_allocation_that_ended_without_a_word_lost_its_batch_host_and_that_counts_as_a_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """slurm.json names an allocation with no end (its batch host, n0, died with the batch step: Slurm requeued the
    job); its members' state files hold the record n0's hub last wrote. The next allocation's batch step (on n1) counts
    n0's loss as a restart and continues that record from the step its members last reported."""
    first = plans(job(HOMES))["n0"]
    login = tmp_path / "jobs" / "k400-a" / "login"
    login.mkdir(parents=True)
    (login / layout.PLAN_FILE).write_text(first.to_json())
    launched = new_record(first, 900.0)
    hub = launched.changed(attempt=2, restarts=1, attempts=(*launched.attempts,) * 3)  # a restart inside it
    for name, mode, record in (("n0", "hub", hub), ("n1", "member", launched), ("n2", "member", None)):
        (login.parent / name).mkdir()
        state = {"mode": mode, "record": record.to_json() if record else None, "progress": {"step": 37}}
        (login.parent / name / layout.STATE_FILE).write_text(json.dumps(state))
    allocation = {"restart": 0, "batch_host": "n0", "members": ["n0", "n1", "n2"], "started_at": 950.0}
    (login / ACCOUNT_FILE).write_text(json.dumps({"slurm_job": "77", "allocations": [allocation],
                                                  "record": launched.to_json(), "next": None,
                                                  "outcome": None}))
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    batch = Batch(str(login), {"trainers": 2})
    batch.previous_allocation_lost()
    assert batch.account.to_json()["allocations"][0]["ended"]["action"] == "requeue"
    record = continued(plans(job(HOMES))["n1"], batch.account.next, 2000.0)
    assert (record.attempt, record.restarts, record.phase) == (3, 2, Phase.RUNNING)
    why = record.attempts[3].cause
    assert why is not None and (why.node, why.kind, why.at, why.failed_step) == ("n0", Kind.LOST, 950.0, 37)
    batch.previous_allocation_lost()  # an allocation that has ended is not lost again
    assert continued(first, batch.account.next, 2000.0).restarts == 2


def test_the_status_after_the_end_on_record_waits_for_the_batch_steps_decision_and_nothing_trains() -> None:
    launched = new_record(plans(job(HOMES))["n0"], 900.0)
    running = Queue(job_id="77", state="RUNNING", reason="None", nodes="", run_time="", time_limit="", restarts=0)
    assert judged(launched, launched, None, None, running, "77") == ("running", launched, True)
    done = ended("failed", "lost")  # its end on record: a requeue may follow, or the end stands
    state, record, training = judged(done, launched, None, None, running, "77")
    assert (state, training, record.phase, record.end) == ("running", False, Phase.WAITING, None)
    assert record.waiting == "the batch step's decision after the end on record (failed: why)"
    state, record, training = judged(done, launched, None, Outcome(EndState("failed"), "no spare", 0.0), None, "77")
    assert (state, training, record.end) == ("failed", False, done.end)
    state, record, training = judged(None, launched, None, None, dataclasses.replace(running, state="PENDING"), "77")
    assert (state, training, record.waiting) == ("running", False, "Slurm: job 77 PENDING (None)")

def test_the_batch_script_asks_slurm_for_requeue_the_signal_and_every_node() -> None:
    login = plans(job(HOMES))["n0"]
    options = {"trainers": 2, "spares": 1, "time": "1-00:00:00", "signal_seconds": 300,
               "site_options": ["--partition=gpu", "--gres=gpu:8"], "iface": "ib0"}
    script = batch_script(login, "/home/u/vidcluster/jobs/k400-a/login", options).splitlines()
    assert script[0] == "#!/home/u/vidcluster/venv/bin/python -PS"  # the training environment, no site, safe path
    asked = [line.removeprefix("#SBATCH ") for line in script if line.startswith("#SBATCH ")]
    assert asked == ["--job-name=vidcluster-k400-a", "--nodes=3", "--ntasks-per-node=1", "--requeue", "--no-kill",
                     "--signal=B:USR1@300", "--output=/home/u/vidcluster/jobs/k400-a/login/batch.log",
                     "--open-mode=append", "--chdir=/home/u/vidcluster/jobs/k400-a/login", "--time=1-00:00:00",
                     "--partition=gpu", "--gres=gpu:8"]
    assert script[-1] == ('sys.exit(slurm.batch("/home/u/vidcluster/jobs/k400-a/login", {"trainers": 2, "iface": '
                          '"ib0"}))')  # values as Python literals, never shell text
    with pytest.raises(SlurmError, match="has a space"):
        batch_script(login, "/home/u v/jobs/k400-a/login", options)


def test_min_nodes_reaches_the_allocations_plans_and_not_the_login_hosts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The login host renders the job as its one member (min_nodes left out); the batch script carries
    vidcluster_min_nodes to the batch step, which gives it to the allocation's description: the world there shrinks
    down to it rather than the job being requeued (trainer.runtime.job.policy)."""
    login = plans(job(HOMES))["n0"]
    options = {"trainers": 3, "spares": 0, "signal_seconds": 300, "min_nodes": 2}
    script = batch_script(login, "/home/u/vidcluster/jobs/k400-a/login", options).splitlines()
    assert script[-1].endswith('{"trainers": 3, "iface": "", "min_nodes": 2}))')
    folder = tmp_path / "login"
    folder.mkdir()
    (folder / layout.PLAN_FILE).write_text(login.to_json())
    (folder / layout.DESCRIPTION_FILE).write_text(json.dumps(
        {"job_id": "k400-a", "port": 0, "nodes": [], "restarts": {"max_restarts": 5, "min_nodes": None}}))
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURMD_NODENAME", "n0")
    facts = [{"name": f"n{i}", "ip": "127.0.0.1", "gpus": 0, "home": "/home/u", "iface": "lo"} for i in range(3)]
    described = Batch(str(folder), json.loads(script[-1].split(", ", 1)[1].removesuffix("))"))).description(facts)
    assert described["restarts"] == {"max_restarts": 5, "min_nodes": 2}
    assert plans(JobSpec.from_json({**described, "code_version": "abc"}))["n0"].min_nodes == 2
    unset = batch_script(login, "/x", {**options, "min_nodes": None}).splitlines()[-1]
    assert unset.endswith('{"trainers": 3, "iface": ""}))')  # every trainer: the job never shrinks
