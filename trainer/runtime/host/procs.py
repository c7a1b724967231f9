"""A job's processes on a node, found by what they carry rather than by pid: a pid is reused, an environment variable
that names the job's folder is not. Linux /proc; standard library only.

Every process of a job carries ``VIDCLUSTER_JOB_DIR=<job folder>``; its training processes also carry
``VIDCLUSTER_TRAINER=<attempt>``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

from trainer.runtime.contract import JOB_DIR_ENV, TRAINER_ENV


def _environ(pid: int) -> list[bytes] | None:
    """The process's environment, or None when it is gone, a zombie, or not ours to read."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat[stat.rindex(")") + 2] == "Z":
            return None
        return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except (OSError, ValueError, IndexError):
        return None


def job_processes(job_dir: str, trainers_only: bool = False) -> list[int]:
    """Live processes of this machine that belong to the job's folder (its trainers only, if asked)."""
    marker = f"{JOB_DIR_ENV}={job_dir}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        env = _environ(int(entry))
        if env is None or marker not in env:
            continue
        if trainers_only and not any(var.startswith(f"{TRAINER_ENV}=".encode()) for var in env):
            continue
        found.append(int(entry))
    return found


def belongs(pid: int, job_dir: str) -> bool:
    """Is ``pid`` a live process of the job (and not a stranger that got its number)?"""
    env = _environ(pid)
    return env is not None and f"{JOB_DIR_ENV}={job_dir}".encode() in env


# Multiprocessing's resource tracker (a training process's, started for its loader workers: trainer.data.loader) is
# never signalled. It ends by itself once every process that holds its pipe has (the training process, the workers'
# fork server, the workers), and only then unlinks the named semaphores that a killed training process left in
# /dev/shm: killed with them, it would leave them there for good.
RESOURCE_TRACKER = b"from multiprocessing.resource_tracker import main"


def _resource_tracker(pid: int) -> bool:
    try:
        return RESOURCE_TRACKER in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def signal_all(pids: list[int], sig: int) -> None:
    """``sig`` to each of ``pids`` that is still there, but to a resource tracker (above)."""
    for pid in pids:
        if _resource_tracker(pid):
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def end(job_dir: str, grace: float, trainers_only: bool = False, first: int = signal.SIGTERM) -> list[int]:
    """``first`` (SIGTERM) to the job's processes, SIGKILL to what is left after ``grace`` seconds; the pids still
    alive 10 s after that (none, unless the kernel is stuck)."""
    def left() -> list[int]:
        return [pid for pid in job_processes(job_dir, trainers_only) if pid != os.getpid()]

    for sig, wait_s in ((first, grace), (signal.SIGKILL, 10.0)):
        signal_all(left(), sig)
        deadline = time.monotonic() + wait_s
        while left() and time.monotonic() < deadline:
            time.sleep(0.2)
        if not left():
            break
    return left()
