"""What a node's training processes say through their heartbeats (trainer/heartbeat.py writes them): which one froze,
where each rank is in its step, and the effort their step clocks count. Read here, for the node
(trainer.runtime.host.node), which reports them to the hub.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from pathlib import Path

from trainer.runtime import layout
from trainer.runtime.contract import WHERE_SUFFIX
from trainer.runtime.host.channel import ProcessReport
from trainer.runtime.job.pace import Beat, Effort, node_effort, read_beat
from trainer.runtime.job.timing import Timings
from trainer.runtime.schema import SchemaError, parse
from trainer.runtime.watch.messages import UNJUDGED, RankProgress, Where


class Heartbeats:
    """The heartbeat folder of a job's node."""

    def __init__(self, job_dir: str, timings: Timings) -> None:
        self.folder = Path(job_dir) / layout.HEARTBEAT_DIR
        self.timings = timings
        self.watched_since = time.monotonic()  # silence counts from here at the earliest (``looked``)
        self.looked_at = self.watched_since

    def looked(self) -> None:
        """The supervisor looks now (every tick). After a gap of half the heartbeat timeout it was not running itself
        (its machine was stopped or suspended, as its trainer was): what the beats say about the gap is nothing, and
        silence counts from now (a node that answers again keeps its trainer, which parks and can rejoin at once)."""
        now = time.monotonic()
        if now - self.looked_at > self.timings.loss / 2:
            self.watched_since = now
        self.looked_at = now

    def beats(self) -> list[tuple[int, Beat]]:
        """(pid, heartbeat) of every training process that beats here (trainer.runtime.job.pace.Beat)."""
        beats = []
        for path in self.folder.iterdir() if self.folder.is_dir() else []:
            beat = read_beat(path) if path.name.isdigit() else None
            if beat is not None:  # else: being written, or not a heartbeat
                beats.append((int(path.name), beat))
        return beats

    def frozen(self) -> tuple[int, float] | None:
        """(pid, seconds) of a live training process whose heartbeat is older than the heartbeat timeout, counted while
        the supervisor looked (``looked``)."""
        for pid, beat in self.beats():
            age = time.monotonic() - max(beat.at, self.watched_since)
            if age > self.timings.loss and Path(f"/proc/{pid}").exists():
                return pid, age
        return None

    def ranks(self, processes: Iterable[ProcessReport]) -> tuple[RankProgress, ...]:
        """Where the rank of each of ``processes`` (an attempt's, each with its rank) is (its heartbeat's ``Where``),
        in seconds before now; none while one rank cannot say (its beats stopped coming: it is frozen, not hung, and
        its node names it when its heartbeat times out; or its first ``Where`` is not written yet): the hub judges
        every rank or none."""
        now = time.monotonic()
        ranks = []
        for process in processes:
            beat = read_beat(self.folder / str(process.pid))
            if beat is None or now - beat.at > 2 * self.timings.report_every:
                return ()
            try:
                where = parse(Where, json.loads((self.folder / f"{process.pid}{WHERE_SUFFIX}").read_text()), "where")
            except (OSError, ValueError, SchemaError):  # not written yet, or being written
                return ()
            assert process.rank is not None
            ranks.append(RankProgress(rank=process.rank, step=where.step, phase=where.phase,
                                      phase_s=round(now - where.since, 2), stalled_s=round(now - where.step_at, 2),
                                      step_s=where.step_s))
        return tuple(ranks)

    def stalled(self, ranks: Iterable[RankProgress]) -> bool:
        """One of ``ranks`` has stalled for the watch's ``stall_report`` in a phase a step is due in: its member
        reports at the waiting cadence, so that a hang is judged, and heard, within moments."""
        return any(r.phase not in UNJUDGED and r.stalled_s > self.timings.stall_report for r in ranks)

    def effort(self, workers: int) -> Effort | None:
        """The node's effort, once each of its ``workers`` training processes has a step clock
        (trainer.runtime.job.pace.node_effort)."""
        return node_effort((beat.effort for _, beat in self.beats() if beat.effort is not None), workers)
