"""The Slurm batch step's decision once its members' step ended (trainer.runtime.job.requeue): pure, as
tests/runtime/test_policy.py tests the restart policy. Each rule of the module's docstring, at its edges."""

from __future__ import annotations

import pytest

from tests.runtime.test_plan import job, plans
from trainer.runtime.job.hub import new_record
from trainer.runtime.job.record import Cause, End, EndState, Failure, JobRecord, Kind
from trainer.runtime.job.requeue import Requeue, TimeLimit, cause, decide, host_lost

NOW = 2000.0
LIMIT = TimeLimit(990.0, "the time limit is near")
LAUNCHED = new_record(plans(job(["/home/u"] * 3))["n0"], 900.0)  # the allocation's first record: no end yet


def ended(state: EndState, kind: Kind, restarts: int = 0) -> JobRecord:
    """A record whose attempt ended ``state``: its first failure of ``kind`` on n1 at 1000 s, named by the hub at
    1004 s, when rank 0 had reported step 37."""
    first = Failure("n1", kind, f"n1 went {kind}", 1000.0)
    return LAUNCHED.changed(restarts=restarts, detected_at=1004.0, failed_step=37, end=End(state, "why", first))


def decided(record: JobRecord, limit: TimeLimit | None = None, cancelled: bool = False,
            max_restarts: int = 3) -> Requeue | End:
    """The decision on n0 (the batch host) of Slurm job 77, rank 0's last reported step 40."""
    return decide(record=record, step=40, time_limit=limit, cancelled=cancelled, batch_host="n0", slurm_job="77",
                  max_restarts=max_restarts, now=NOW)


def test_a_cancel_stops_the_job_unless_the_time_limit_came_first() -> None:
    assert decided(ended(EndState.FAILED, Kind.LOST), cancelled=True) == End(
        EndState.STOPPED, "Slurm job 77 was cancelled", None)
    assert decided(LAUNCHED, cancelled=True) == End(EndState.STOPPED, "Slurm job 77 was cancelled", None)
    # Slurm's SIGTERM after the time limit's signal is the time limit's end: the job requeues.
    assert isinstance(decided(LAUNCHED, LIMIT, cancelled=True), Requeue)


@pytest.mark.parametrize("record", [LAUNCHED, ended(EndState.STOPPED, Kind.STOPPED)], ids=["no end", "stopped"])
def test_the_time_limit_requeues_a_job_not_ended_or_stopped_at_the_agreed_step_and_that_is_no_restart(
    record: JobRecord
) -> None:
    assert decided(record, LIMIT) == Requeue(
        Cause("n0", Kind.PREEMPTED, "the time limit is near", 990.0, None, detected_at=NOW, detect_s=1010.0,
              failed_step=40), counted=False)
    assert decided(record, LIMIT, max_restarts=0) == decided(record, LIMIT)  # whatever restarts are left


@pytest.mark.parametrize("state", [EndState.FINISHED, EndState.FAILED])
def test_the_time_limit_leaves_a_job_that_ended_otherwise_ended(state: EndState) -> None:
    record = ended(state, Kind.REJECTED)
    assert decided(record, LIMIT) == record.end


def test_a_node_lost_with_no_spare_is_requeued_as_the_hub_named_it_while_restarts_are_left() -> None:
    # The hub's detection time and step, not the batch step's: the cause as the hub would have recorded it.
    assert decided(ended(EndState.FAILED, Kind.LOST, restarts=2)) == Requeue(
        Cause("n1", Kind.LOST, "n1 went lost; no spare in the allocation", 1000.0, None, detected_at=1004.0,
              detect_s=4.0, failed_step=37), counted=True)
    no_restart_left = ended(EndState.FAILED, Kind.LOST, restarts=3)
    assert decided(no_restart_left) == no_restart_left.end
    unnamed = LAUNCHED.changed(end=End(EndState.FAILED, "why", Failure("n1", Kind.LOST, "n1 went lost", 1000.0)))
    requeued = decided(unnamed)  # no time on record for the hub's naming: named now
    assert isinstance(requeued, Requeue) and (requeued.cause.detected_at, requeued.cause.detect_s) == (NOW, 1000.0)


@pytest.mark.parametrize("kind", [Kind.KILLED, Kind.FROZEN, Kind.HUNG, Kind.EXITED, Kind.REJECTED, Kind.SLOW])
def test_a_failure_the_allocation_could_have_healed_stands(kind: Kind) -> None:
    record = ended(EndState.FAILED, kind)
    assert decided(record) == record.end


@pytest.mark.parametrize("state", [EndState.FINISHED, EndState.STOPPED])
def test_an_end_that_is_no_failure_stands_whatever_node_was_lost_first(state: EndState) -> None:
    record = ended(state, Kind.LOST)
    assert decided(record) == record.end


def test_a_step_that_ended_without_an_end_on_record_lost_its_supervisors() -> None:
    why = "the job's step ended without an end on record"
    assert decided(LAUNCHED.changed(restarts=2)) == Requeue(
        Cause("n0", Kind.LOST, f"{why} (its supervisors were killed)", NOW, None, detected_at=NOW, detect_s=0.0,
              failed_step=40), counted=True)
    assert decided(LAUNCHED.changed(restarts=3)) == End(EndState.FAILED, why, None)
    assert decided(LAUNCHED, max_restarts=0) == End(EndState.FAILED, why, None)


def test_a_lost_batch_host_is_named_from_its_allocations_start_and_counts() -> None:
    assert host_lost("n0", 950.0, 37, NOW) == Requeue(
        Cause("n0", Kind.LOST, "the allocation's first node (n0, which ran the batch step and the hub) was lost",
              950.0, None, detected_at=NOW, detect_s=1050.0, failed_step=37), counted=True)
    assert cause("n1", Kind.LOST, "gone", 1000.0, None, 1000.34).detect_s == 0.3  # rounded to a tenth
