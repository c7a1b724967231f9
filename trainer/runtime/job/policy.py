"""The restart policy: once an attempt has ended badly, end the job, wait for a lost node, or restart, and with which
nodes in which ranks. Pure: the hub (trainer.runtime.job.hub) feeds it what it knows and carries out the decision.

In order:
1. a user's stop ends the job (stopped); a bad input (the trainer's exit status 2) ends it (failed): a restart
   cannot fix either;
2. no restart left (``max_restarts`` used) ends it;
3. a node is replaced by a spare when it was lost, when it fails again in the attempt after a restart, or when the
   hub stopped the attempt to swap it as a straggler (kind slow: trainer.runtime.job.straggler); the spare
   takes its node rank (the world size never changes, so neither does the global batch). When the rank-0 node is
   replaced, rank 0 goes to the node that had rank 1 (it holds the second copy of the checkpoints and the run's
   history) and the spare takes rank 1; every other node keeps its rank;
4. without a spare: a lost node is waited for (``node_wait`` seconds), then the job ends; a node that failed the same
   way twice in a row ends the job; a node that failed again in another way is given another try; a straggler
   trains on;
5. otherwise the same nodes restart in the same ranks.
Every restart counts toward ``max_restarts``, preemptions included.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from trainer.runtime.contract import COPY_NODE_RANK
from trainer.runtime.job.record import EndState, Failure, Kind
from trainer.runtime.job.verdict import words


class Action(StrEnum):
    RESTART = "restart"
    WAIT = "wait"  # for lost nodes to come back
    END = "end"


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: str
    assignment: dict[str, int] = field(default_factory=dict)  # restart: node -> node rank
    replaced: dict[str, str] = field(default_factory=dict)  # restart: lost or failing node -> its replacement
    end_state: EndState | None = None  # end: failed or stopped
    waiting_for: tuple[str, ...] = ()  # wait: the lost nodes


def same_way(a: Failure, b: Failure) -> bool:
    return a.node == b.node and a.kind == b.kind and a.rc == b.rc


def _ranks_after(assignment: Mapping[str, int], replaced: Mapping[str, str]) -> dict[str, int]:
    ranks = {node: rank for node, rank in assignment.items() if node not in replaced}
    deputy = next((node for node, rank in ranks.items() if rank == COPY_NODE_RANK), None)
    for old, new in replaced.items():
        rank = assignment[old]
        if rank == 0 and deputy is not None:  # the node with the second copy of the checkpoints becomes rank 0
            ranks[deputy], rank = 0, COPY_NODE_RANK
        ranks[new] = rank
    return dict(sorted(ranks.items(), key=lambda item: item[1]))


def decide(
    *,
    first: Failure,
    previous: Failure | None,
    assignment: Mapping[str, int],
    lost: Mapping[str, str],
    available: Sequence[str],
    restarts_used: int,
    max_restarts: int,
    waited: bool,
    node_wait: float,
) -> Decision:
    """``first``: the attempt's first failure; ``previous``: the previous attempt's, when this attempt was a restart;
    ``lost``: node -> why, for assigned nodes that are lost; ``available``: idle members that may join (spares first,
    in member order); ``waited``: the wait for the lost nodes is over."""
    said = words(first)
    if first.kind == Kind.STOPPED:
        return Decision(Action.END, f"stopped: {first.reason}", end_state=EndState.STOPPED)
    if first.kind == Kind.REJECTED:
        return Decision(Action.END, f"{said}; a restart cannot fix a bad input: fix it and launch again",
                        end_state=EndState.FAILED)
    if restarts_used >= max_restarts:
        left = ("restarts are off (max_restarts 0)" if max_restarts == 0
                else f"no restart left ({restarts_used} of {max_restarts} used)")
        return Decision(Action.END, f"{said}; {left}", end_state=EndState.FAILED)
    again = previous is not None and previous.node == first.node and first.node not in lost
    spares = [node for node in available if node not in assignment]
    replaced: dict[str, str] = {}
    waiting: list[str] = []
    for node in sorted(assignment, key=lambda n: assignment[n]):
        slow = first.kind == Kind.SLOW and node == first.node
        if node not in lost and not (again and node == first.node) and not slow:
            continue
        if spares:
            replaced[node] = spares.pop(0)
        elif node in lost:
            waiting.append(node)
        elif slow:
            continue
        elif previous is not None and same_way(previous, first):
            return Decision(Action.END, f"{said}, the same way as in the attempt before, and no spare can replace "
                            "it", end_state=EndState.FAILED)
    if waiting:
        lost_words = "; ".join(f"{node} was lost ({lost[node]})" for node in waiting)
        if waited:
            return Decision(Action.END, f"{lost_words}; no spare could replace it, and it did not come back within "
                            f"{node_wait:.0f} s", end_state=EndState.FAILED)
        return Decision(Action.WAIT, f"{lost_words}; no spare: waiting up to {node_wait:.0f} s for it to come back",
                        waiting_for=tuple(waiting))
    why = f"{said}; restart {restarts_used + 1} of {max_restarts}"
    if replaced:
        why += "; " + ", ".join(f"{new} replaces {old}" for old, new in replaced.items())
    return Decision(Action.RESTART, why, assignment=_ranks_after(assignment, replaced), replaced=replaced)
