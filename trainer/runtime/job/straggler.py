"""Slow nodes (stragglers): when a node is named, and what the hub does about it. Pure decisions; the hub
(trainer.runtime.job.hub) feeds them the nodes' paces (trainer.runtime.job.pace) and carries them out.

In data-parallel training one slow node (a GPU throttling, a bad link, a noisy neighbour, a disk half-dead) holds
every step of every node back to its pace, and nothing fails. A node is *slow* while its pace (the median time per
step of the attempt's other nodes over its own) is below ``threshold``; it is *named* once it has been slow for
``window`` seconds without a break. What follows is the plan's ``action`` (group variable
``vidcluster_straggler_action``):

    auto      replace, when the job has a spare; report otherwise (the default)
    replace   at the next optimizer step every rank checkpoints at the same step and the attempt ends (a
              preemption's stop: no step is lost); the next attempt starts with a spare in the slow node's rank,
              exactly as a lost node is replaced (trainer.runtime.job.policy). The node is marked in the job's record
              and never chosen again for this job
    drop      at the next optimizer step every rank checkpoints at the same step and the attempt ends, as for
              replace; the next attempt starts without the slow node (no spare takes its rank: the world shrinks,
              trainer.runtime.job.policy), when the nodes left are ``min_nodes`` at least (vidcluster_min_nodes);
              it is named and trains on otherwise
    report    named in the record, the follow and the status; it trains on
    off       never named (paces are still shown in the hub's picture)

A swap needs a free spare (a drop: enough nodes left) and a restart left (a swap or a drop counts as a restart), and
comes at least ``cooldown`` seconds after the job's last swap; until then the node is named with the reason it trains
on. No node is swapped twice: once out, it is never a spare of the job again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from trainer.runtime.job.record import JobRecord, Straggler

MEASURE_REPORTS = 2  # a node's time per step is measured over at least two reports' time


class Treatment(StrEnum):
    AUTO = "auto"
    REPLACE = "replace"
    DROP = "drop"
    REPORT = "report"
    OFF = "off"


@dataclass(frozen=True)
class Rules:
    """The plan's straggler settings (seconds)."""

    threshold: float = 0.7  # a node is slow while its pace is below this (0.7: it takes 1/0.7 = 1.43x the others' time)
    window: float = 300.0  # it is named after being slow this long
    action: Treatment = Treatment.AUTO
    cooldown: float = 1800.0  # the least time between two swaps of the job

    def __post_init__(self) -> None:
        if not 0 < self.threshold < 1:
            raise ValueError(f"stragglers: threshold {self.threshold:g} must be between 0 and 1 (a pace: 0.7 names a "
                             "node that takes 1.43x the others' time per step)")
        if self.window <= 0 or self.cooldown < 0:
            raise ValueError(f"stragglers: window ({self.window:g} s) must be positive and cooldown "
                             f"({self.cooldown:g} s) not negative")

    def span(self, report_every: float) -> float:
        """The window a node's time per step is measured over: a quarter of the naming window, two reports at
        least."""
        return max(self.window / 4, MEASURE_REPORTS * report_every)


class Watch:
    """Which nodes have been slow for a whole window (the hub forgets it all at each new attempt)."""

    def __init__(self, rules: Rules) -> None:
        self.rules = rules
        self.slow_since: dict[str, float] = {}  # node -> when its current streak's first slow window was measured

    def observe(self, paces: Mapping[str, tuple[float, float]], now: float) -> dict[str, tuple[float, float]]:
        """``paces``: node -> (pace, when it was measured); node -> (pace, seconds slow) of the nodes slow for
        ``window`` seconds now (counted from the first slow measurement: a measurement's window may have begun
        before the node slowed down)."""
        if self.rules.action == Treatment.OFF:
            return {}
        for node, (pace, since) in paces.items():
            if pace < self.rules.threshold:
                self.slow_since.setdefault(node, since)
            else:
                self.slow_since.pop(node, None)
        return {node: (paces[node][0], now - since) for node, since in self.slow_since.items()
                if node in paces and now - since >= self.rules.window}

    def reset(self) -> None:
        self.slow_since.clear()


@dataclass(frozen=True)
class Turn:
    """What the hub does about its stragglers now: the record's stragglers, the lines for its log, and the node to
    swap for a spare (its entry names the spare), if any."""

    stragglers: dict[str, Straggler]
    said: tuple[str, ...]
    swap: str | None


def turn(watch: Watch, record: JobRecord, paces: Mapping[str, tuple[float, float]], spare: str | None,
         min_nodes: int, now: float, wall: float) -> Turn:
    """Name the nodes slow for a whole window, and swap one for ``spare`` (the first free spare), or drop it (action
    drop: ``min_nodes`` left at least), when the rules allow; ``paces``: node -> (pace, when it was measured) of the
    running attempt's nodes."""
    stragglers, said = dict(record.stragglers), []
    for node, (pace, slow_for) in sorted(watch.observe(paces, now).items()):
        known = stragglers.get(node)
        if known is None:
            known = Straggler(named_at=wall, pace=round(pace, 3), slow_for=round(slow_for, 1), replaced_by="",
                              replaced_at=None, note="")
            said.append(f"{node} is a straggler: it trained at {pace:.2f}x the pace of the other nodes for "
                        f"{slow_for:.0f} s")
        why = why_not_swap(watch.rules, record, spare, min_nodes, wall)
        if not why:
            drop = watch.rules.action == Treatment.DROP
            stragglers[node] = dataclasses.replace(known, replaced_by="" if drop else str(spare), replaced_at=wall)
            said.append(f"attempt {record.attempt}: {'dropping' if drop else 'swapping'} straggler {node}"
                        f"{'' if drop else ' for ' + str(spare)}: every node checkpoints at the next step and stops")
            return Turn(stragglers, tuple(said), node)
        if why != known.note:
            said.append(f"{node} trains on: {why}")
            stragglers[node] = dataclasses.replace(known, note=why)
    return Turn(stragglers, tuple(said), None)


def swapped(record: JobRecord, replaced: Mapping[str, str], left: Sequence[str]) -> dict[str, Straggler]:
    """The stragglers once the next attempt starts: a swap asked for in the attempt that ends took place (with the
    spare the policy chose: ``replaced``), a drop did (the node is among those that ``left``), or neither did (no
    spare was left, or too few nodes)."""
    stragglers = {}
    for node, named in record.stragglers.items():
        if named.replaced_at is not None and node in left:
            named = dataclasses.replace(named, note="left the world (straggler action drop)")
        elif named.replaced_at is not None and node in record.assignment:
            new = replaced.get(node, "")
            named = dataclasses.replace(named, replaced_by=new, replaced_at=named.replaced_at if new else None,
                                        note="" if new else "no spare was free when its attempt stopped")
        stragglers[node] = named
    return stragglers


def why_not_swap(rules: Rules, record: JobRecord, spare: str | None, min_nodes: int, wall: float) -> str:
    """Why a named node trains on now ('' when it is swapped for ``spare``, the first free spare, None: none; or
    dropped, leaving ``min_nodes`` at least)."""
    if rules.action == Treatment.REPORT:
        return "the straggler action is report"
    if rules.action == Treatment.DROP and len(record.assignment) - 1 < min_nodes:
        return (f"dropping it would leave {len(record.assignment) - 1} nodes, and the job trains on {min_nodes} at "
                "least (vidcluster_min_nodes)")
    if rules.action != Treatment.DROP and spare is None:
        return "no spare is free to replace it"
    if record.restarts >= record.max_restarts:
        return f"no restart left to swap it ({record.restarts} of {record.max_restarts} used)"
    last = max((s.replaced_at for s in record.stragglers.values() if s.replaced_at is not None), default=None)
    if last is not None and wall - last < rules.cooldown:
        return f"the job's last swap was {wall - last:.0f} s ago (at least {rules.cooldown:.0f} s between swaps)"
    return ""


def swap_reason(straggler: Straggler, rules: Rules) -> str:
    """The failure's words when a named node is swapped (or dropped)."""
    then = "it leaves the world" if rules.action == Treatment.DROP else "a spare takes its rank"
    return (f"a straggler: it trained at {straggler.pace:.2f}x the pace of the other nodes for "
            f"{straggler.slow_for:.0f} s (threshold {rules.threshold:g}); every rank checkpoints at the next step "
            f"and {then}")
