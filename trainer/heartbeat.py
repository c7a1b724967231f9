"""Liveness and pace for the launcher's watch: while a training process lives, a daemon thread writes its heartbeat,
``$VIDCLUSTER_HEARTBEAT_DIR/<pid>``, every ``$VIDCLUSTER_HEARTBEAT_INTERVAL`` seconds: the node's monotonic clock and
what the process's step clock has counted in its attempt (trainer/pace.py), one line of JSON
(trainer.runtime.pace.Beat).

The node's supervisor (trainer/runtime/node.py) sets both variables and treats a live process whose
heartbeat has gone stale as frozen (SIGSTOP, a hung filesystem, a wedged driver): the job restarts without it; the
counts go to the job's hub, which finds slow nodes (trainer.runtime.straggler) and counts the job's goodput.
A thread keeps beating while the main thread waits in a collective, so a slow step is never taken for a frozen one.
Without the variables (a run by hand, torchrun) nothing happens.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from trainer.runtime.contract import HEARTBEAT_DIR_ENV, HEARTBEAT_INTERVAL_ENV
from trainer.runtime.pace import Beat, Effort, beat_text

EffortSource = Callable[[], Effort | None]


class _Measured:
    """What this process's beats carry: its step clock's effort, once a clock is there (``measure``)."""

    def __init__(self) -> None:
        self.effort: EffortSource = lambda: None


_MEASURED = _Measured()


def measure(source: EffortSource) -> None:
    """From now on this process's beats carry ``source()`` (its current attempt's step clock)."""
    _MEASURED.effort = source


def _write(path: Path, tmp: Path) -> None:
    tmp.write_text(beat_text(Beat(at=round(time.monotonic(), 3), effort=_MEASURED.effort())))
    os.replace(tmp, path)


def _beat(path: Path, interval: float) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    while True:
        with contextlib.suppress(OSError):  # a full disk must not kill training; the watch will say so
            _write(path, tmp)
        time.sleep(interval)


def start_heartbeat() -> None:
    """Start this process's heartbeat thread, once, if the launcher asked for one."""
    folder = os.environ.get(HEARTBEAT_DIR_ENV)
    if not folder:
        return
    path = Path(folder) / str(os.getpid())
    if path.exists():
        return  # already beating (launch and a worker can be the same process)
    interval = float(os.environ.get(HEARTBEAT_INTERVAL_ENV, "5"))
    atexit.register(lambda: path.unlink(missing_ok=True))
    _write(path, path.with_name(f".{path.name}.tmp"))
    threading.Thread(target=_beat, args=(path, interval), name="vidcluster-heartbeat", daemon=True).start()
