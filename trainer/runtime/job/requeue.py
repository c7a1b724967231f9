"""The Slurm batch step's decision once its members' step has ended: the end on record stands, or Slurm requeues the
job, and whether the requeue counts as a restart. Pure: the batch step (trainer.runtime.slurm.allocation) feeds it what
it knows and carries the decision out. Inside the allocation the restart policy (trainer.runtime.job.policy) heals what
the allocation's nodes can; this decides only what they cannot.

In order:
1. a cancel (SIGTERM from Slurm) without the time limit's signal: the job stopped;
2. the time limit's signal came (``TimeLimit``) and the job had not ended, or ended stopped (every rank checkpointed
   at the agreed step): requeue, as a preemption on the batch host; not counted;
3. the step ended without an end on record (its supervisors were killed): requeue, as the batch host lost; counted,
   while restarts are left (``max_restarts``), else the job failed;
4. the job failed with a node lost first (no spare in the allocation could take its rank, and fewer than
   ``min_nodes`` would have been left: else the world shrank inside the allocation, trainer.runtime.job.policy):
   requeue, as that node lost; counted, while restarts are left (the next allocation has every node again);
5. otherwise the end on record stands (finished, a user's stop, a bad input, another failure, no restart left).
An allocation whose batch host was lost took its batch step with it: Slurm requeued the job, and the next allocation
counts it as a restart (``host_lost``).
"""

from __future__ import annotations

from dataclasses import dataclass

from trainer.runtime.job.record import Cause, End, EndState, JobRecord, Kind


@dataclass(frozen=True)
class TimeLimit:
    """The time limit's signal (SIGUSR1 from sbatch --signal): when it came, and the reason the job's record gives."""

    at: float
    reason: str


@dataclass(frozen=True)
class Requeue:
    cause: Cause  # what ended the allocation, as the next allocation's first attempt records it
    counted: bool  # it counts toward max_restarts


def cause(node: str, kind: Kind, reason: str, at: float, failed_step: int | None, detected_at: float) -> Cause:
    """A failure that ended an allocation, named at ``detected_at`` (the hub's word, or the batch step's now)."""
    return Cause(node, kind, reason, at, None, detected_at=detected_at, detect_s=round(detected_at - at, 1),
                 failed_step=failed_step)


def decide(*, record: JobRecord, step: int | None, time_limit: TimeLimit | None, cancelled: bool, batch_host: str,
           slurm_job: str, max_restarts: int, now: float) -> Requeue | End:
    """``record``: the freshest record of the ended step (or the allocation's first, when no trainer started);
    ``step``: the last step rank 0 reported; ``cancelled``: Slurm sent the batch step SIGTERM."""
    end = record.end
    if cancelled and time_limit is None:
        return End(EndState.STOPPED, f"Slurm job {slurm_job} was cancelled", None)
    if time_limit is not None and (end is None or end.state == EndState.STOPPED):
        return Requeue(cause(batch_host, Kind.PREEMPTED, time_limit.reason, time_limit.at, step, now), counted=False)
    left = record.restarts < max_restarts
    if end is None:
        why = "the job's step ended without an end on record"
        if left:
            return Requeue(cause(batch_host, Kind.LOST, f"{why} (its supervisors were killed)", now, step, now),
                           counted=True)
        return End(EndState.FAILED, why, None)
    first = end.first_failure
    if end.state == EndState.FAILED and first is not None and first.kind == Kind.LOST and left:
        named = record.detected_at if record.detected_at is not None else now
        return Requeue(cause(first.node, Kind.LOST, f"{first.reason}; no spare in the allocation", first.at,
                             record.failed_step, named), counted=True)
    return end


def host_lost(host: str, started_at: float, step: int | None, now: float) -> Requeue:
    """The allocation before ended without a word from its batch step: its first node (the batch host and the hub)
    was lost since ``started_at``, after rank 0 had reported ``step``. Counted."""
    why = f"the allocation's first node ({host}, which ran the batch step and the hub) was lost"
    return Requeue(cause(host, Kind.LOST, why, started_at, step, now), counted=True)
