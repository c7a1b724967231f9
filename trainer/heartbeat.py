"""Liveness and pace for the launcher's watch: while a training process lives, a daemon thread writes its heartbeat,
``$VIDCLUSTER_HEARTBEAT_DIR/<pid>``, every ``$VIDCLUSTER_HEARTBEAT_INTERVAL`` seconds: the node's monotonic clock and
what the process's step clock has counted in its attempt (trainer/pace.py), one line of JSON
(trainer.runtime.job.pace.Beat).

The node's supervisor (trainer/runtime/host/node.py) sets both variables and treats a live process whose
heartbeat has gone stale as frozen (SIGSTOP, a hung filesystem, a wedged driver): the job restarts without it; the
counts go to the job's hub, which finds slow nodes (trainer.runtime.job.straggler) and counts the job's goodput.
A thread keeps beating while the main thread waits in a collective, so a slow step is never taken for a frozen one;
for the same reason a beat alone cannot tell a hung rank from a live one: beside it, ``<pid>.where`` says where the
process is (trainer.runtime.watch.messages.Where: its step, its phase, its usual step time), which the training loop
marks (``at``, ``stepped``); the hub names a rank whose step stopped while the others wait in a collective
(trainer.runtime.job.verdict.hung).
Without the variables (a run by hand, torchrun) nothing happens.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import faulthandler
import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainer.runtime import atomic, schema
from trainer.runtime.contract import HEARTBEAT_DIR_ENV, HEARTBEAT_INTERVAL_ENV, STACKS_SIGNAL, WHERE_SUFFIX
from trainer.runtime.job.pace import Beat, Effort, beat_text
from trainer.runtime.watch.messages import COLLECTIVE, STARTING, UNJUDGED, Where

EffortSource = Callable[[], Effort | None]
GRADIENTS = COLLECTIVE + "gradients"  # the gradient all-reduce
STEP_WEIGHT = 0.2  # the usual step time follows each new step by this much (an exponential average)


class _Beating:
    """This process's heartbeat file, once it beats."""

    def __init__(self) -> None:
        self.path: Path | None = None


class _Measured:
    """What this process's beats carry: its step clock's effort, once a clock is there (``measure``)."""

    def __init__(self) -> None:
        self.effort: EffortSource = lambda: None


class _Progress:
    """Where this process is: what the training loop marked last (``at``, ``stepped``)."""

    def __init__(self) -> None:
        self.restart()

    def restart(self) -> None:
        now = time.monotonic()
        self.where = Where(step=0, phase=STARTING, since=now, step_at=now, step_s=None)


_BEATING = _Beating()
_MEASURED = _Measured()
_PROGRESS = _Progress()
WATCHED = "_vidcluster_watched"  # a parameter's mark: its gradient marks GRADIENTS (watch_gradients)


def at(phase: str) -> None:
    """This process enters ``phase`` of its step (trainer.runtime.watch.messages: DATA, COMPUTE, COLLECTIVE + a
    name...). Out of a phase that is no step (its attempt's start, an epoch's end), its step's time starts now."""
    where, now = _PROGRESS.where, time.monotonic()
    if where.phase != phase:
        step_at = now if where.phase in UNJUDGED else where.step_at
        _PROGRESS.where = dataclasses.replace(where, phase=phase, since=now, step_at=step_at)


def where() -> Where:
    """Where this process is: what the training loop marked last."""
    return _PROGRESS.where


def stepped() -> None:
    """This process took an optimizer step; its usual step time follows, from its attempt's second step on (the
    first one warms up)."""
    where, now = _PROGRESS.where, time.monotonic()
    took = now - where.step_at
    if where.step == 0:
        usual = None
    else:
        usual = took if where.step_s is None else (1 - STEP_WEIGHT) * where.step_s + STEP_WEIGHT * took
    _PROGRESS.where = dataclasses.replace(where, step=where.step + 1, step_at=now, step_s=usual)


def validated() -> None:
    """A validation batch is done. A validating rank (VALIDATE) is judged by its batches as a training one is by its
    steps: one stuck in a batch (a loader worker that never answers) is named hung while its peers wait in the sums'
    all-reduce, not left to the collective's timeout. Its step count and usual step time stay its training's."""
    _PROGRESS.where = dataclasses.replace(_PROGRESS.where, step_at=time.monotonic())


def watch_gradients(model: Any) -> None:
    """Once a gradient of ``model`` is accumulated, this process waits in the gradient all-reduce (DDP reduces each
    bucket as its gradients are ready, and the backward returns when all are reduced); once per model."""
    for param in model.parameters():
        if param.requires_grad and not getattr(param, WATCHED, False):
            setattr(param, WATCHED, True)  # a model kept across attempts (restart in place) is watched once
            param.register_post_accumulate_grad_hook(lambda _param: at(GRADIENTS))


def restart_progress() -> None:
    """A new attempt in this process (restart in place): its steps count from its start. Said at once, not at the next
    beat: the supervisor hands the next attempt as soon as the process parks, and a report of that attempt carrying
    the place where the attempt before left it (its step stopped seconds ago, in a collective) names it hung."""
    _PROGRESS.restart()
    if _BEATING.path is not None:
        with contextlib.suppress(OSError):
            _write_where(_BEATING.path)


def measure(source: EffortSource) -> None:
    """From now on this process's beats carry ``source()`` (its current attempt's step clock)."""
    _MEASURED.effort = source


def _write_where(path: Path) -> None:
    atomic.write(path.with_name(path.name + WHERE_SUFFIX), json.dumps(schema.dump(_PROGRESS.where)), atomic.SHARED)


def _write(path: Path) -> None:
    _write_where(path)
    atomic.write(path, beat_text(Beat(at=round(time.monotonic(), 3), effort=_MEASURED.effort())), atomic.SHARED)


def _beat(path: Path, interval: float) -> None:
    while True:
        with contextlib.suppress(OSError):  # a full disk must not kill training; the watch will say so
            _write(path)
        time.sleep(interval)


def start_heartbeat() -> None:
    """Start this process's heartbeat thread, once, if the launcher asked for one; from then on STACKS_SIGNAL writes
    every thread's stack to stderr (its log), from a signal handler that runs even while the main thread is stuck in C
    holding the GIL: the supervisor asks for them before it kills a trainer that hung or would not leave."""
    folder = os.environ.get(HEARTBEAT_DIR_ENV)
    if not folder:
        return
    faulthandler.register(STACKS_SIGNAL, all_threads=True)
    path = Path(folder) / str(os.getpid())
    if path.exists():
        return  # already beating (launch and a worker can be the same process)
    interval = float(os.environ.get(HEARTBEAT_INTERVAL_ENV, "5"))
    atexit.register(lambda: (path.unlink(missing_ok=True),
                             path.with_name(path.name + WHERE_SUFFIX).unlink(missing_ok=True)))
    _write(path)
    _BEATING.path = path
    threading.Thread(target=_beat, args=(path, interval), name="vidcluster-heartbeat", daemon=True).start()
