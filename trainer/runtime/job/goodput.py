"""The job's goodput: of the wall time from its launch to its end (or now), the part that advanced training, and
where the rest was lost. Pure: computed from the job's record (its attempts, their causes, and what each attempt's
trainers spent: trainer.runtime.job.pace) whenever an attempt starts or the job ends (trainer.runtime.job.hub), and
shown by training-status.yml and the follow (trainer.runtime.report).

Each attempt is cut at its first batch (``training_from``) and at the failure that ended it (its last sign of life,
``cause.at``):

    start-up     the launch to the first attempt's first batch
    restart      the hub naming a failure to the next attempt's first batch (stopping, deciding, waiting for a node,
                 starting again, loading the checkpoint); of it, apart, the restarts into a world of another size
                 (a node left with no spare, or joined): what the world changes cost the survivors
    detection    a failure's last sign of life to the hub naming it
    recomputed   steps trained after the checkpoint the next attempt resumed from (trained twice)
    checkpoint   steps stalled by checkpoints
    data         steps waiting for data
    trained      the rest of the steps' time: computing, and the all-reduce waits of steps that count
    other        what no counter covers: evaluation, epoch ends, the last moments before a failure not yet reported

so the parts add up to the wall time. The counters are those of the slowest node of each attempt (the one the others
wait for): its data wait is the job's.

From the measured checkpoint cost (stall per checkpoint, delta) and the time between unplanned failures (M: the
wall time over the failures; preemptions, user stops, straggler swaps and grows lose nothing and do not count), Young's
interval sqrt(2 delta M) is the checkpoint interval that loses least (Young 1974; Daly 2006 refines it by delta, which
is small here); a configured CHECKPOINT_MINUTES more than ``FAR`` times off it is worth changing, and the suggestion
says to what.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from trainer.runtime.job.pace import Effort
from trainer.runtime.job.record import Goodput, JobRecord, Kind

FAR = 2.0  # a configured interval this many times longer or shorter than Young's is named
# Interruptions that lose no training (or end it): a grow (joined) goes on from the trainers' memory.
PLANNED = (Kind.PREEMPTED, Kind.STOPPED, Kind.SLOW, Kind.REJECTED, Kind.JOINED)


def account(record: JobRecord, current: Effort | None, end: float) -> Goodput:
    """The job's goodput from its launch to ``end`` (wall clock); ``current``: the running attempt's effort so far."""
    attempts = record.attempts
    spent: dict[int, Effort] = {s.attempt: s.effort for s in record.spent}
    if current is not None:
        spent[record.attempt] = current
    parts = dict.fromkeys(("startup", "restart", "detection", "recomputed", "checkpoint", "data", "trained"), 0.0)
    changed = {change.attempt for change in record.world_changes}
    world_change = 0.0
    for index, attempt in enumerate(attempts):
        after = attempts[index + 1] if index + 1 < len(attempts) else None
        begun = attempt.started_at if attempt.cause is None else attempt.cause.detected_at
        over = after.cause.at if after is not None and after.cause is not None else end
        effort = spent.get(attempt.attempt)
        trained_from = min(effort.training_from, over) if effort is not None else over
        to_first_batch = max(0.0, trained_from - begun)
        parts["startup" if index == 0 else "restart"] += to_first_batch
        if attempt.attempt in changed:
            world_change += to_first_batch
        if after is not None and after.cause is not None:
            parts["detection"] += max(0.0, after.cause.detected_at - after.cause.at)
        if effort is not None:
            recomputed = _recomputed(effort, spent.get(after.attempt) if after is not None else None)
            parts["recomputed"] += recomputed
            parts["trained"] += effort.compute_s + effort.sync_s - recomputed
            parts["checkpoint"] += effort.checkpoint_s
            parts["data"] += effort.data_s
    wall = max(0.0, end - attempts[0].started_at)
    failures = sum(1 for a in attempts if a.cause is not None and a.cause.kind not in PLANNED)
    every = max((e.checkpoint_every_s for e in spent.values()), default=0.0)
    young = young_interval(list(spent.values()), wall, failures)
    return Goodput(
        wall_s=round(wall, 1), **{f"{key}_s": round(value, 1) for key, value in parts.items()},
        other_s=round(wall - sum(parts.values()), 1), failures=failures, checkpoint_every_s=every,
        young_daly_s=None if young is None else round(young, 1), suggestion=suggestion(every, young),
        world_change_s=round(world_change, 1),
    )


def _recomputed(effort: Effort, resumed: Effort | None) -> float:
    """Seconds of ``effort``'s steps that the next attempt trained again: those after the step it resumed from."""
    if resumed is None or effort.steps == 0:
        return 0.0
    again = max(0, min(effort.start_step + effort.steps - resumed.start_step, effort.steps))
    return again * (effort.compute_s + effort.sync_s) / effort.steps


def young_interval(efforts: Sequence[Effort], wall: float, failures: int) -> float | None:
    """sqrt(2 x checkpoint cost x mean time between failures), seconds; None without a failure or a checkpoint."""
    checkpoints = sum(e.checkpoints for e in efforts)
    if failures == 0 or checkpoints == 0:
        return None
    cost = sum(e.checkpoint_s for e in efforts) / checkpoints
    return math.sqrt(2 * cost * wall / failures)


def suggestion(every: float, young: float | None) -> str:
    """Words for a configured interval far from Young's ('' when it is close enough, or nothing is known)."""
    if young is None or young <= 0:
        return ""
    if every > 0 and 1 / FAR <= every / young <= FAR:
        return ""
    now = f"CHECKPOINT_MINUTES {every / 60:.3g}" if every > 0 else "no mid-epoch checkpoint (CHECKPOINT_MINUTES 0)"
    return (f"{now} is far from {young / 60:.2g} ({young:.0f} s), the interval that loses least at this job's "
            "checkpoint cost and failure rate (Young/Daly)")

