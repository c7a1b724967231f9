"""The restart policy: once an attempt has ended badly, end the job, wait for a lost node, or restart, and with which
nodes in which ranks; and while an attempt runs on fewer nodes than the launch's, whether nodes join it (``grow``).
Pure: the hub (trainer.runtime.job.hub) feeds it what it knows and carries out the decision.

In order:
1. a user's stop ends the job (stopped); a bad input (the trainer's exit status 2) ends it (failed): a restart
   cannot fix either;
2. no restart left (``max_restarts`` used) ends it;
3. a node is replaced by a spare when it was lost, when it fails again in the attempt after a restart, or when the
   hub stopped the attempt to swap it as a straggler (kind slow: trainer.runtime.job.straggler); the spare
   takes its node rank (the world size never changes, so neither does the global batch). When the rank-0 node is
   replaced, rank 0 goes to the node that had rank 1 (it holds the second copy of the checkpoints and the run's
   history) and the spare takes rank 1; every other node keeps its rank;
4. a lost node no spare can replace, or a straggler dropped (straggler action ``drop``, which never takes a spare),
   leaves the world when the nodes left are ``min_nodes`` at least: the job restarts at once on them (the decision's
   ``left``), node ranks compacted to 0..n-1 in their order, rank 0 going to the rank-1 node when the rank-0 node left
   (as for a replacement). The trainer keeps the global batch (its ranks learn the new world from the attempt's
   ``world_urls``);
5. otherwise, without a spare: a lost node is waited for (``node_wait`` seconds), then the job ends; a node that failed
   the same way twice in a row ends the job; a node that failed again in another way is given another try; a
   straggler trains on;
6. otherwise the same nodes restart in the same ranks.
Every restart counts toward ``max_restarts``, preemptions included.

``grow``: while an attempt runs, nothing failed, on fewer nodes than the launch's (rule 4 made it smaller), members
free to take a rank (a lost node that answered again, a spare) join it at once, in ``available``'s order, up to the
launch's number of nodes less the stragglers dropped (a drop gives no spare their rank, then or later). Every node
keeps its rank and the joiners take the next ones, so rank 0 and the node with the second copy of the checkpoints stay
where they are. A grow is no failure and does not count toward ``max_restarts``.
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
    left: tuple[str, ...] = ()  # restart: nodes that leave the world, no spare taking their rank (in rank order)
    joined: tuple[str, ...] = ()  # restart (a grow): nodes that join the world (in their new rank order)


def same_way(a: Failure, b: Failure) -> bool:
    return a.node == b.node and a.kind == b.kind and a.rc == b.rc


def _ranks_after(assignment: Mapping[str, int], replaced: Mapping[str, str], left: Sequence[str]) -> dict[str, int]:
    ranks = {node: rank for node, rank in assignment.items() if node not in replaced and node not in left}
    deputy = next((node for node, rank in ranks.items() if rank == COPY_NODE_RANK), None)
    for old, new in replaced.items():
        rank = assignment[old]
        if rank == 0 and deputy is not None:  # the node with the second copy of the checkpoints becomes rank 0
            ranks[deputy], rank = 0, COPY_NODE_RANK
        ranks[new] = rank
    if any(assignment[node] == 0 for node in left) and deputy is not None:
        ranks[deputy] = 0  # as for a replacement: the node with the second copy of the checkpoints
    order = sorted(ranks, key=lambda node: ranks[node])
    return {node: rank for rank, node in enumerate(order)}  # a world that shrank has no gaps


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
    min_nodes: int,
    drop_slow: bool = False,
) -> Decision:
    """``first``: the attempt's first failure; ``previous``: the previous attempt's, when this attempt was a restart
    (what ended it: a grow's ``joined`` is no failure, and a joiner's first failure is not its second);
    ``lost``: node -> why, for assigned nodes that are lost; ``available``: idle members that may join (spares first,
    in member order); ``waited``: the wait for the lost nodes is over; ``min_nodes``: the fewest nodes the job trains
    on (``len(assignment)``: it never shrinks); ``drop_slow``: a straggler leaves the world rather than take a spare
    (straggler action drop)."""
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
    again = (previous is not None and previous.kind != Kind.JOINED and previous.node == first.node
             and first.node not in lost)
    spares = [node for node in available if node not in assignment]
    replaced: dict[str, str] = {}
    waiting: list[str] = []
    dropped: list[str] = []
    for node in sorted(assignment, key=lambda n: assignment[n]):
        slow = first.kind == Kind.SLOW and node == first.node
        if node not in lost and not (again and node == first.node) and not slow:
            continue
        if slow and drop_slow:
            dropped.append(node)
        elif spares:
            replaced[node] = spares.pop(0)
        elif node in lost:
            waiting.append(node)
        elif slow:
            continue
        elif previous is not None and same_way(previous, first):
            return Decision(Action.END, f"{said}, the same way as in the attempt before, and no spare can replace "
                            "it", end_state=EndState.FAILED)
    left = tuple(sorted(waiting + dropped, key=lambda n: assignment[n]))
    if len(assignment) - len(left) >= min_nodes:
        waiting = []  # they leave the world
    else:
        left = ()  # too few would be left: the lost nodes are waited for, a straggler trains on
    if waiting:
        lost_words = "; ".join(f"{node} was lost ({lost[node]})" for node in waiting)
        fewer = "" if min_nodes >= len(assignment) else (
            f" (the job trains on {min_nodes} nodes at least, {len(assignment) - len(waiting)} would be left)")
        if waited:
            return Decision(Action.END, f"{lost_words}; no spare could replace it{fewer}, and it did not come back "
                            f"within {node_wait:.0f} s", end_state=EndState.FAILED)
        return Decision(Action.WAIT, f"{lost_words}; no spare{fewer}: waiting up to {node_wait:.0f} s for it to come "
                        "back", waiting_for=tuple(waiting))
    why = f"{said}; restart {restarts_used + 1} of {max_restarts}"
    if replaced:
        why += "; " + ", ".join(f"{new} replaces {old}" for old, new in replaced.items())
    if left:
        why += (f"; {', '.join(left)} {'leaves' if len(left) == 1 else 'leave'} the world, no spare taking "
                f"{'its rank' if len(left) == 1 else 'their ranks'}: {len(assignment)} nodes -> "
                f"{len(assignment) - len(left)}")
    return Decision(Action.RESTART, why, assignment=_ranks_after(assignment, replaced, left), replaced=replaced,
                    left=left)


def grow(assignment: Mapping[str, int], full: int, available: Sequence[str]) -> Decision | None:
    """The restart that brings a smaller world back up to ``full`` nodes (the launch's, less the stragglers dropped:
    see the module docstring); ``available``: members that may take a rank, in the order they are taken. None when the
    world is full already, or no member can join it."""
    joiners = tuple(node for node in available if node not in assignment)[:max(0, full - len(assignment))]
    if not joiners:
        return None
    ranks = {**assignment, **{node: len(assignment) + i for i, node in enumerate(joiners)}}
    why = (f"{', '.join(joiners)} {'joins' if len(joiners) == 1 else 'join'} the world: {len(assignment)} nodes -> "
           f"{len(ranks)}")
    return Decision(Action.RESTART, why, assignment=ranks, joined=joiners)
