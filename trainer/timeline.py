"""This training process's account of itself to its node's supervisor: the attempt it belongs to, its rank, its state
(standby, training, parked) and the wall-clock time it reached each phase of its attempt (trainer.runtime.host.channel:
started, imported, group, checkpoint, first_step). Written to ``$VIDCLUSTER_CHANNEL/<pid>.json`` whenever it changes,
by every process that trains (and a standby); without the variable (a run by hand) nothing is written.

The supervisor turns the node's processes' phases into the attempt's timeline in the job's record (training-status.yml
shows it); a benchmark sets the variable under torchrun to read the same phases (bench/restarts.py).
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from trainer.runtime.contract import CHANNEL_ENV, TRAINER_ENV
from trainer.runtime.host import channel
from trainer.runtime.host.channel import PHASES, ProcessReport, ProcState


def process_started() -> float:
    """When this process started (wall clock), from the kernel's account; now when it cannot be read."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        boot = next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, StopIteration, IndexError):
        return time.time()


def attempt_of_env() -> int | None:
    """The attempt this process was started for: its supervisor's number, torchrun's restart count, or None (a
    standby, a run by hand)."""
    for name in (TRAINER_ENV, "TORCHELASTIC_RESTART_COUNT"):
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return None


class Timeline:
    def __init__(self) -> None:
        folder = os.environ.get(CHANNEL_ENV)
        self.path = Path(folder) / f"{os.getpid()}.json" if folder else None
        self.attempt = attempt_of_env()
        self.rank: int | None = None
        self.state = ProcState.TRAINING
        self.phases: dict[str, float] = {"started": process_started()}
        self.micro_batches: int | None = None
        self.last_step: float | None = None  # wall clock: its last optimizer step, in whichever attempt
        self.step_before: float | None = None  # its last optimizer step before this attempt (in an earlier one)

    def begin(self, attempt: int) -> None:
        """This process was handed ``attempt`` (a standby, or in place): its imports are done already."""
        now = time.time()
        self.attempt, self.state, self.phases = attempt, ProcState.TRAINING, {"started": now, "imported": now}
        self.micro_batches, self.step_before = None, self.last_step
        self.write()

    def mark(self, phase: str) -> None:
        """``phase`` (channel.PHASES) reached now, unless it was already in this attempt."""
        assert phase in PHASES, phase
        if phase not in self.phases:
            self.phases[phase] = time.time()
            self.write()

    def accumulating(self, micro_batches: int) -> None:
        """This attempt's optimizer steps are made of ``micro_batches`` micro-batches here (the world's, kept for the
        global batch: trainer.elastic.Recipe)."""
        self.micro_batches = micro_batches
        self.write()

    def stepped(self) -> None:
        """An optimizer step is done (should the attempt end now, it is the last one before the next)."""
        self.last_step = time.time()

    def set(self, state: ProcState, rank: int | None = None) -> None:
        self.state = state
        if rank is not None:
            self.rank = rank
        self.write()

    def write(self) -> None:
        """The report, for a process that trains (it has a rank) or waits as the standby."""
        if self.path is None or (self.rank is None and self.state != ProcState.STANDBY):
            return
        report = ProcessReport(pid=os.getpid(), attempt=self.attempt, rank=self.rank, state=self.state,
                               phases=dict(self.phases), micro_batches=self.micro_batches,
                               step_before=self.step_before)
        with contextlib.suppress(OSError):  # a full disk must not end training; the supervisor just sees less
            channel.write(self.path, report)
        channel.wake(self.path.parent)


# This process's timeline: one per process (spawned workers and torchrun's workers each have their own).
PROCESS = Timeline()
