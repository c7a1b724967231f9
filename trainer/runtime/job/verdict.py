"""What a failure is, and which node failed first: decided here, and nowhere else.

A failure (trainer.runtime.job.record.Failure) names the node, its kind, the reason in words, ``at`` the wall-clock time
of the failed part's last sign of life (the exit its supervisor saw, its last heartbeat, its last report to the hub) and
``rc`` the trainer's exit status when it has one. The kinds, as the node that saw them names them:

    rejected   the trainer exited with status 2: its input (config, data, weights) is bad; a restart cannot fix it
    stopped    a user stopped the job (stop-training.yml)
    preempted  the node was told to make way (SIGTERM/SIGUSR1 to its supervisor); the trainer checkpointed (75)
    killed     the trainer was killed by a signal, or ended without an exit status
    frozen     a training process stopped beating (SIGSTOP, a hung filesystem, a wedged driver)
    hung       a rank beats but its step stopped while the other ranks wait for it in a collective (``hung``: a
               rank stuck in NCCL, in its data, in a checkpoint): the hub names it, its node kills it
    lost       the node stopped answering the hub, never joined, or did not confirm its trainer stopped
    exited     the trainer exited with another status (a crash, or the loss of its peers)
    slow       the hub named the node a straggler and stops the attempt to swap it for a spare (or drop it)
               (trainer.runtime.job.straggler): every trainer checkpoints at a common step first
    parked     the trainer left its attempt and waits in place for the next one (it lost its peers)

and one kind that is no failure and no node names: ``joined``, the cause of an attempt that started because nodes
joined a world smaller than the launch's (trainer.runtime.job.policy.grow); it is never judged here.

When one node fails, its peers fail soon after, in the collective they were waiting in ("connection closed by peer"):
those are consequences. So the first failure is the earliest one of the most telling tier of kinds: a bad input or a
user's stop; then what happened to a node from outside (killed, frozen, lost: whichever came first); then a
preemption; then plain exits and trainers that left their attempt to wait in place; last, a straggler's swap (any
real failure while it stops is named instead).
"""

from __future__ import annotations

import signal
from collections.abc import Iterable

from trainer.runtime.contract import EXIT_PREEMPTED, EXIT_REJECTED
from trainer.runtime.job.record import Failure, Kind
from trainer.runtime.job.timing import Timings
from trainer.runtime.watch.messages import CHECKPOINT, UNJUDGED, VALIDATE, RankProgress

# Kinds by tier: a failure of an earlier tier explains the later ones; within a tier, the earlier failure does.
TIERS = ((Kind.REJECTED, Kind.STOPPED), (Kind.KILLED, Kind.FROZEN, Kind.HUNG, Kind.LOST), (Kind.PREEMPTED,),
         (Kind.EXITED, Kind.PARKED), (Kind.SLOW,))


def exit_failure(rc: int | None) -> tuple[Kind, str]:
    """(kind, words) for a trainer that ended with status ``rc`` (None: no status, a negative one: a signal)."""
    if rc is None:
        return Kind.KILLED, "its trainer ended without an exit status"
    if rc < 0:
        try:
            name = f" ({signal.Signals(-rc).name})"
        except ValueError:
            name = ""
        return Kind.KILLED, f"its trainer was killed by signal {-rc}{name}"
    if rc == EXIT_REJECTED:
        return Kind.REJECTED, f"its trainer rejected its input (exit status {EXIT_REJECTED}; the log says what to fix)"
    if rc == EXIT_PREEMPTED:
        return Kind.PREEMPTED, f"its trainer checkpointed and stopped when asked (exit status {EXIT_PREEMPTED})"
    return Kind.EXITED, f"its trainer exited with status {rc}"


def first_failure(failures: Iterable[Failure]) -> Failure | None:
    """The failure that explains the others (see the module docstring), or None when there is none."""
    def tier(kind: Kind) -> int:
        return next(i for i, kinds in enumerate(TIERS) if kind in kinds)

    return min(failures, key=lambda f: (tier(f.kind), f.at), default=None)


def no_consequence(failure: Failure) -> bool:
    """A failure no peer's failure causes (a bad input, a user's stop, what happened to a node from outside): the hub
    names it without waiting for a cause to arrive. Only another node's outside failure, earlier still, could
    explain it: rare, and the stopping attempt names that one instead when it arrives."""
    return failure.kind in TIERS[0] + TIERS[1]


def words(first: Failure) -> str:
    """'node1 failed first: its trainer was killed by signal 9 (SIGKILL)'."""
    return f"{first.node} failed first: {first.reason}"


def hung(ranks: Iterable[tuple[str, RankProgress]], timings: Timings, wall: float) -> Failure | None:
    """The hung rank of an attempt (node, its rank's progress: every rank of the attempt, freshly reported), or None.

    Hung: a rank the others wait for in a collective, whose step has not advanced for ``hang_factor`` times its usual
    step time, and no less than its floor (``hang_floor``; ``checkpoint_floor`` while it saves a checkpoint). A rank
    that waits in a collective itself is never named while another does not: it waits for that one (a rank that
    stopped beating is not among ``ranks``: it is frozen, its node names it). Only when every rank waits (a collective
    that never ends: a fabric gone, a communicator wedged) is one of the waiters named: the last to enter it. Of
    several, the one furthest behind. A rank before its second step, or at its attempt's start or an epoch's end
    (UNJUDGED) is not judged; a validating one (VALIDATE) is, by its batches, each of which counts as a step: the
    pass takes as long as the validation set does, a batch no longer than a step."""
    each = [(node, r) for node, r in ranks]
    judged = [(node, r) for node, r in each if r.step_s is not None and r.phase not in UNJUDGED]
    blocked = [(node, r) for node, r in judged if not r.waiting]
    if blocked:
        stalled = [(node, r) for node, r in blocked if r.stalled_s > _limit(r, timings)]
        if not stalled:
            return None
        node, rank = min(stalled, key=lambda item: (item[1].step, item[1].phase_s))
    elif judged and all(r.waiting for _, r in each):
        node, rank = min(judged, key=lambda item: item[1].phase_s)
        if rank.stalled_s <= _limit(rank, timings):
            return None
    else:
        return None
    waiting = sorted(r.rank for _, r in each if r.waiting and r.rank != rank.rank)
    if not waiting:
        return None
    assert rank.step_s is not None
    unit = "validation batch" if rank.phase == VALIDATE else "step"
    reason = (f"its rank {rank.rank} hung in {rank.phase}, {rank.step} steps into its attempt: no {unit} for "
              f"{rank.stalled_s:.0f} s (its usual step: {rank.step_s:.2f} s), while rank(s) "
              f"{', '.join(map(str, waiting))} wait in a collective")
    return Failure(node, Kind.HUNG, reason, wall - rank.stalled_s)


def _limit(rank: RankProgress, timings: Timings) -> float:
    """How long ``rank``'s step may stall before it is hung (see ``hung``)."""
    assert rank.step_s is not None
    floor = timings.checkpoint_floor if rank.phase == CHECKPOINT else timings.hang_floor
    return max(floor, timings.hang_factor * rank.step_s)
