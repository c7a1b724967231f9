"""This process's step clock: each optimizer step of its attempt split into waiting for data, computing, waiting for
the other ranks and checkpoint stalls, summed since the attempt's first batch (trainer.runtime.job.pace.Effort: the
heartbeat carries the sums to the node's supervisor, whose hub finds slow nodes and counts the job's goodput).

How the wait in the gradient all-reduce is told from computing: a hook on every parameter notes when its gradient is
accumulated (the last one: this rank's backward is computed, and DDP has started the all-reduce of every bucket);
DDP's backward returns once every bucket is reduced, so the time from the last gradient to the backward's return is
this rank's wait for the others in it (parameter hooks leave DDP's communication hook, one per model, to others). The
step's agreement (trainer.coordination: one small all-reduce) is waiting too. On a GPU the compute and all-reduce
points are CUDA events on the compute stream, read once they have passed; waiting for data and checkpoint stalls are
the host's wall clock everywhere.

The first batch of an attempt (or of an epoch) is not a data wait: its loader starts then (the attempt's start-up, or
the epoch's end, which the job's goodput counts apart).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from trainer.runtime.job.pace import Effort

PENDING_STEPS = 8  # a GPU's steps not yet read back, at most (then the host waits for the oldest)


@dataclass
class _Step:
    """One optimizer step's marks: host seconds (CPU) or CUDA events (GPU)."""

    start: Any  # its first batch in hand
    ready: Any = None  # the last gradient bucket ready (this rank's backward computed)
    back: Any = None  # the backward returned: every bucket reduced
    end: Any = None  # the optimizer step done
    waited: float = 0.0  # host seconds: the step's agreement with the other ranks
    stalled: float = 0.0  # host seconds: a checkpoint


class StepClock:
    def __init__(self, device: Any, start_step: int, checkpoint_every_s: float) -> None:
        self.cuda = getattr(device, "type", "cpu") == "cuda"
        self.effort = Effort(steps=0, data_s=0.0, compute_s=0.0, sync_s=0.0, checkpoint_s=0.0, checkpoints=0,
                             start_step=start_step, training_from=0.0, checkpoint_every_s=checkpoint_every_s)
        self.started = False  # the attempt's first batch has come
        self.waiting_since: float | None = None  # host clock: this rank asked for its next batch
        self.step: _Step | None = None
        self.pending: collections.deque[_Step] = collections.deque()

    # -- the marks ---------------------------------------------------------------------------------------------------

    def _mark(self) -> Any:
        if not self.cuda:
            return time.perf_counter()
        import torch

        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def _seconds(self, first: Any, last: Any) -> float:
        if first is None or last is None:
            return 0.0
        return first.elapsed_time(last) / 1000.0 if self.cuda else last - first

    # -- what the training loop tells it -----------------------------------------------------------------------------

    def attach(self, model: Any) -> None:
        """Note when each parameter's gradient is accumulated: the last one, this rank's backward is computed."""
        def ready(_param: Any) -> None:
            step = self.step
            if step is None:
                return
            if not self.cuda:
                step.ready = time.perf_counter()
            elif step.ready is None:
                step.ready = self._mark()
            else:
                step.ready.record()  # one event per step, recorded again at each gradient: it marks the last

        for param in model.parameters():
            if param.requires_grad:
                param.register_post_accumulate_grad_hook(ready)

    def epoch_start(self) -> None:
        """An epoch begins: its first batch comes from a loader that starts now (not a data wait)."""
        self.waiting_since = None

    def batch_ready(self) -> None:
        now = time.perf_counter()
        if not self.started:
            self.started = True
            self.effort = _add(self.effort, training_from=time.time())
        if self.waiting_since is not None:
            self.effort = _add(self.effort, data_s=now - self.waiting_since)
        if self.step is None:
            self.step = _Step(start=self._mark())

    def backward_done(self) -> None:
        if self.step is not None and self.step.ready is not None:
            self.step.back = self._mark()
        self.waiting_since = time.perf_counter()  # a micro-batch of gradient accumulation asks for the next

    @contextlib.contextmanager
    def waiting(self) -> Iterator[None]:
        """The block waits for the other ranks (the step's agreement)."""
        began = time.perf_counter()
        try:
            yield
        finally:
            if self.step is not None:
                self.step.waited += time.perf_counter() - began

    @contextlib.contextmanager
    def stalled(self) -> Iterator[None]:
        """The block is a checkpoint the step waits for."""
        began = time.perf_counter()
        try:
            yield
        finally:
            seconds = time.perf_counter() - began
            if self.step is not None:
                self.step.stalled += seconds
            else:  # at an epoch's end
                self.effort = _add(self.effort, checkpoint_s=seconds)
            self.effort = _add(self.effort, checkpoints=1)

    def step_done(self) -> None:
        """The optimizer step is done, and what follows it (agreement, checkpoint)."""
        step, self.step = self.step, None
        if step is None:
            return
        step.end = self._mark()
        self.pending.append(step)
        self._read_back()
        self.waiting_since = time.perf_counter()

    def _read_back(self) -> None:
        """Add the steps whose marks have passed (at once on the CPU; a GPU's when its events are done)."""
        while self.pending:
            step = self.pending[0]
            if self.cuda and not step.end.query():
                if len(self.pending) <= PENDING_STEPS:
                    return
                step.end.synchronize()
            self.pending.popleft()
            whole = self._seconds(step.start, step.end)
            reduce = self._seconds(step.ready, step.back)
            host = step.waited + step.stalled
            # On the CPU the host's waits are inside the step's wall time; a GPU's timeline does not hold them.
            compute = max(0.0, whole - reduce - (0.0 if self.cuda else host))
            self.effort = _add(self.effort, steps=1, compute_s=compute, sync_s=reduce + step.waited,
                               checkpoint_s=step.stalled)


def _add(effort: Effort, **more: float) -> Effort:
    """``effort`` with ``more`` added to its sums (``training_from`` set)."""
    return dataclasses.replace(effort, **{key: value if key == "training_from" else getattr(effort, key) + value
                                          for key, value in more.items()})
