"""What every rank does together at an optimizer step: a mid-epoch checkpoint every TRAIN.CHECKPOINT_MINUTES, and a
stop when any process was sent SIGTERM or SIGUSR1.

After each optimizer step every rank adds its flags (checkpoint due, stop requested, clips trained in the step) into
one all-reduce of three integers, as Megatron-LM agrees on its exit signal, so all ranks reach the same verdict at the
same step. A checkpoint is due when rank 0's clock says CHECKPOINT_MINUTES of training have passed since the last
checkpoint (one clock: ranks never disagree about time). A stop is requested when any process got a stop signal
(errors.STOP_SIGNALS: what a node supervisor passes on, what Slurm's ``--signal`` sends to every task); the handler
only sets a flag, and the training loop acts on it at the next step. Under nccl the flags travel through a gloo group
on the CPU (distributed.host_group), so reading them never waits for the GPU. Its cost: ``python -m bench --only
checkpoint``.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from trainer import heartbeat
from trainer.distributed import DistContext, all_reduce_sum, host_group
from trainer.errors import STOP_SIGNALS, restore_stop_handlers
from trainer.runtime.watch.messages import COLLECTIVE

AGREE = COLLECTIVE + "agree"  # a process waits in the step's agreement (its heartbeat says so: trainer.heartbeat)


class StopRequest:
    """Whether this process was asked to stop (by a signal)."""

    def __init__(self) -> None:
        self.signal: int | None = None

    def set(self, signum: int, _frame: object = None) -> None:
        self.signal = signum

    @property
    def requested(self) -> bool:
        return self.signal is not None


@contextlib.contextmanager
def stop_signals() -> Iterator[StopRequest]:
    """A StopRequest that the stop signals set while the block runs (previous handlers come back after it)."""
    request = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield request  # only the main thread may set handlers: an embedded trainer is stopped by its host
        return
    previous = {sig: signal.signal(sig, request.set) for sig in STOP_SIGNALS}
    try:
        yield request
    finally:
        restore_stop_handlers(previous, request.requested)



@dataclass(frozen=True)
class Verdict:
    """What every rank agreed on after a step."""

    checkpoint: bool  # a mid-epoch checkpoint is due
    stop: bool  # some process was asked to stop: checkpoint, then end with the preempted status
    clips: int  # clips trained in the step, all ranks together


class StepControl:
    """The per-step agreement. Every process makes one, at the same point (it may create a process group)."""

    def __init__(self, ctx: DistContext, checkpoint_minutes: float, stop: StopRequest) -> None:
        self.ctx = ctx
        self.interval_s = 60.0 * checkpoint_minutes
        self.stop = stop
        self.group = host_group()
        self._last_checkpoint = time.monotonic()

    def agree(self, step_clips: int) -> Verdict:
        """This step's verdict: one all-reduce of three integers."""
        heartbeat.at(AGREE)
        due = (self.ctx.is_main and self.interval_s > 0
               and time.monotonic() - self._last_checkpoint >= self.interval_s)
        flags = torch.tensor([int(due), int(self.stop.requested), step_clips], dtype=torch.int64)
        checkpoint, stop, clips = all_reduce_sum(flags, self.group).tolist()
        return Verdict(checkpoint > 0, stop > 0, clips)

    def checkpointed(self) -> None:
        """A checkpoint was taken now: the next is due CHECKPOINT_MINUTES from here."""
        self._last_checkpoint = time.monotonic()
