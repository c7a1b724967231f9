"""How fast each node trains: what its training processes spend their optimizer steps on, carried from each process
to its node's supervisor in its heartbeat, summed up for the node in the member's reports, and scored at the hub
against the other nodes (trainer.runtime.job.straggler names the slow ones; trainer.runtime.job.goodput counts the job's
time).

A training process (trainer/pace.py keeps the sums, trainer/heartbeat.py writes them) writes its heartbeat
``$VIDCLUSTER_HEARTBEAT_DIR/<pid>`` as one line of JSON, a ``Beat``: its monotonic clock, and its ``Effort`` since its
attempt's first batch: optimizer steps, and the seconds of them spent waiting for data, computing (forward, backward,
optimizer), waiting in the gradient all-reduce and the step's agreement for the other ranks, and stalled by
checkpoints. In data-parallel training every rank takes every step together, so a slow rank shows as its own time
(data and compute) being long while every other rank waits for it in the all-reduce: the rank the others wait for
waits least.

A node's effort (``node_effort``) is its slowest process's (a node with one slow GPU is a slow node). The hub's
``PaceBook`` turns each node's reports into its time per step over a window of at least ``span`` seconds and
``MIN_STEPS`` steps, and a node's *pace* is the median time per step of the other nodes of the attempt over its own:
1.0 keeps up, 0.5 takes twice as long.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from trainer.runtime import schema

MIN_STEPS = 2  # a node's time per step is measured over at least this many steps


@dataclass(frozen=True)
class Effort:
    """What one training process (or a node: ``node_effort``) spent in its attempt since its first batch."""

    steps: int  # optimizer steps done in the attempt
    data_s: float  # waiting for the next batch
    compute_s: float  # forward, backward and the optimizer step
    sync_s: float  # waiting for the other ranks: the gradient all-reduce, the step's agreement
    checkpoint_s: float  # steps stalled by checkpoints (the state gathered and handed to the writer)
    checkpoints: int
    start_step: int  # the optimizer step the attempt began from (a resumed attempt: its checkpoint's)
    training_from: float  # wall clock: the attempt's first batch was in hand (its start-up over)
    checkpoint_every_s: float  # CONFIG.TRAIN.CHECKPOINT_MINUTES in seconds (0: at epoch ends only)

    @property
    def own_s(self) -> float:
        """What the process took itself, not waiting for others."""
        return self.data_s + self.compute_s


@dataclass(frozen=True)
class Beat:
    """A training process's heartbeat file."""

    at: float  # its node's monotonic clock
    effort: Effort | None  # None until its attempt's first batch (or for a trainer without a step clock)


@dataclass(frozen=True)
class Pace:
    """A node's effort in an attempt, as its member reports it to the hub."""

    attempt: int
    effort: Effort


def beat_text(beat: Beat) -> str:
    return json.dumps(schema.dump(beat))


def read_beat(path: Path) -> Beat | None:
    """A heartbeat file; None while it is being written or when it is not one."""
    try:
        return schema.parse(Beat, json.loads(path.read_text()), path.name)
    except (OSError, ValueError):
        return None


def node_effort(efforts: Iterable[Effort], workers: int) -> Effort | None:
    """The node's effort: its slowest process's own time, its least waiting; None until all ``workers`` have one."""
    each = list(efforts)
    if not each or len(each) < workers:
        return None
    return Effort(
        steps=min(e.steps for e in each), data_s=max(e.data_s for e in each),
        compute_s=max(e.compute_s for e in each), sync_s=min(e.sync_s for e in each),
        checkpoint_s=max(e.checkpoint_s for e in each), checkpoints=max(e.checkpoints for e in each),
        start_step=min(e.start_step for e in each), training_from=max(e.training_from for e in each),
        checkpoint_every_s=max(e.checkpoint_every_s for e in each),
    )


def slowest(efforts: Iterable[Effort]) -> Effort | None:
    """The effort of the node the others waited for: the most time of its own (data and compute)."""
    return max(efforts, key=lambda e: e.own_s, default=None)


@dataclass
class _Track:
    """A node's measurement in progress: where its current window began, and its last full window's time per
    step (measured when that window ended: when the current one began)."""

    attempt: int
    base: Effort
    base_at: float  # monotonic
    per_step: float | None = None


class PaceBook:
    """Each node's time per step over its last window (the hub feeds it its members' reports), and their paces."""

    def __init__(self, span: float) -> None:
        self.span = span
        self.tracks: dict[str, _Track] = {}
        self.latest: dict[str, Pace] = {}  # node -> its last report's

    def heard(self, node: str, pace: Pace | None, now: float) -> None:
        if pace is None:
            return
        self.latest[node] = pace
        track, effort = self.tracks.get(node), pace.effort
        if track is None or track.attempt != pace.attempt or effort.steps < track.base.steps:
            self.tracks[node] = _Track(pace.attempt, effort, now)
            return
        steps = effort.steps - track.base.steps
        if steps >= MIN_STEPS and now - track.base_at >= self.span:
            track.per_step = (effort.own_s - track.base.own_s) / steps
            track.base, track.base_at = effort, now

    def effort(self, attempt: int, nodes: Iterable[str]) -> Effort | None:
        """The attempt's effort so far: its slowest node's, as last reported."""
        return slowest(pace.effort for node in nodes if (pace := self.latest.get(node)) is not None
                       and pace.attempt == attempt)

    def paces(self, attempt: int, nodes: Iterable[str]) -> dict[str, tuple[float, float]]:
        """node -> (its pace against the median of the others, when the window it was measured over ended), for the
        attempt's nodes that have one (every node needs another to be measured against)."""
        times = {node: (track.per_step, track.base_at) for node in nodes if (track := self.tracks.get(node)) is not None
                 and track.attempt == attempt and track.per_step is not None}
        ordered = sorted(per_step for per_step, _ in times.values())
        paces = {}
        for node, (per_step, measured_at) in times.items():
            median = median_without(ordered, bisect.bisect_left(ordered, per_step))
            if median > 0 and per_step > 0:
                paces[node] = (median / per_step, measured_at)
        return paces


def median_without(ordered: Sequence[float], index: int) -> float:
    """The median of ``ordered`` (sorted) without its element at ``index``, in constant time (the hub scores every
    node against the others each tick: O(N log N) for N nodes, not N²); 0.0 when nothing is left."""
    size = len(ordered) - 1
    if size <= 0:
        return 0.0

    def kept(k: int) -> float:  # the k-th element of ``ordered`` without ``index``
        return ordered[k] if k < index else ordered[k + 1]

    middle = size // 2
    return kept(middle) if size % 2 else (kept(middle - 1) + kept(middle)) / 2


def rounded(paces: Mapping[str, tuple[float, float]]) -> dict[str, float]:
    """The paces alone, to two places (the hub's picture)."""
    return {node: round(pace, 2) for node, (pace, _) in paces.items()}
