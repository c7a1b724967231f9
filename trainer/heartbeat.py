"""Liveness for the launcher's watch: while a training process lives, a daemon thread writes the node's monotonic
clock to ``$VIDCLUSTER_HEARTBEAT_DIR/<pid>`` every ``$VIDCLUSTER_HEARTBEAT_INTERVAL`` seconds.

The node's supervisor (trainer/runtime/node.py) sets both variables and treats a live process whose
heartbeat has gone stale as frozen (SIGSTOP, a hung filesystem, a wedged driver): the job restarts without it.
A thread keeps beating while the main thread waits in a collective, so a slow step is never taken for a frozen one.
Without the variables (a run by hand, torchrun) nothing happens.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import threading
import time
from pathlib import Path

from trainer.runtime.contract import HEARTBEAT_DIR_ENV, HEARTBEAT_INTERVAL_ENV


def _beat(path: Path, interval: float) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    while True:
        with contextlib.suppress(OSError):  # a full disk must not kill training; the watch will say so
            tmp.write_text(f"{time.monotonic():.3f}")
            os.replace(tmp, path)
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
    path.write_text(f"{time.monotonic():.3f}")
    threading.Thread(target=_beat, args=(path, interval), name="vidcluster-heartbeat", daemon=True).start()
