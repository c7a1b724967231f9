"""This node's trainer, one attempt at a time: started and stopped to match the job's record, and watched.

The supervisor calls ``reconcile`` with every record it hears and ``poll`` every tick; the node starts the trainer for
an attempt that assigns it a rank (once per attempt), stops it when the record no longer wants it, notices when it
exits or freezes, and says so in ``trainer`` and ``trouble``, which go to the hub in the member's reports.

Stopping: a trainer that is stopped because the attempt is over gets SIGTERM; one stopped for a user or a
preemption gets SIGUSR1 (the trainer then checkpoints at a step every rank agrees on and exits with status 75); a
frozen one gets SIGKILL. Whatever is left after the plan's stop grace gets SIGKILL.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from trainer.runtime import layout, procs
from trainer.runtime.contract import (
    ATTEMPT_ENV,
    ATTEMPT_FIELDS,
    HEARTBEAT_DIR_ENV,
    HEARTBEAT_INTERVAL_ENV,
    JOB_DIR_ENV,
    TRAINER_ENV,
    thread_budget,
)
from trainer.runtime.messages import IDLE, Trainer, TrainerState, Trouble
from trainer.runtime.nodestate import read_json
from trainer.runtime.plan import NodePlan
from trainer.runtime.record import JobRecord, Kind, Phase
from trainer.runtime.schema import JsonObject

PROGRESS_LIMIT = 16 * 1024  # bytes of rank 0's status.json a report carries whole (the watch's lines are bounded)
PROGRESS_KEYS = ("state", "epoch", "epochs", "step", "steps_per_epoch", "metrics", "clips_per_s", "eta_s")


def free_port(ip: str) -> int:
    """A port nothing listens on at ``ip`` now: the next attempt's rendezvous, if this node becomes rank 0."""
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((ip, 0))
        return int(sock.getsockname()[1])


def attempt_env(attempt: int, record: JobRecord) -> dict[str, str]:
    """The trainer's account of what ended the attempt before this one (contract.ATTEMPT_ENV), if one did."""
    cause = record.cause
    if cause is None:
        return {}
    told = {"attempt": attempt, "cause": cause.kind.value, "node": cause.node, "detected_at": cause.detected_at,
            "detect_s": cause.detect_s, "failed_step": cause.failed_step}
    assert told.keys() == ATTEMPT_FIELDS.keys()
    return {ATTEMPT_ENV: json.dumps(told)}


class Node:
    def __init__(self, plan: NodePlan, say: Callable[[str], None]) -> None:
        self.plan = plan
        self.timings = plan.timings
        self.job_dir = plan.paths.job_dir
        self.say = say
        self.proc: subprocess.Popen[bytes] | None = None
        self.trainer: Trainer = IDLE
        self.trouble: Trouble | None = None  # what this node saw go wrong in its current attempt
        self.started_attempts: set[int] = set()
        self.stop_deadline: float | None = None
        self.stop_asked = False  # a user's stop or a preemption: the trainer must not be started again here

    @property
    def running(self) -> bool:
        return self.trainer.running

    # -- matching the record ---------------------------------------------------------------------------------------

    def reconcile(self, record: JobRecord) -> None:
        attempt, rank = record.attempt, record.rank_of(self.plan.node)
        wanted = record.end is None and record.phase == Phase.RUNNING and rank is not None and not self.stop_asked
        if wanted and rank is not None and not self.running and attempt not in self.started_attempts:
            self.start(attempt, rank, record)
        elif self.running and (not wanted or self.trainer.attempt != attempt):
            why = record.end.reason if record.end is not None else f"attempt {self.trainer.attempt} is over"
            self.stop(why, signal.SIGTERM)

    def start(self, attempt: int, rank: int, record: JobRecord) -> None:
        beats = Path(self.job_dir) / layout.HEARTBEAT_DIR
        beats.mkdir(exist_ok=True)
        for old in beats.iterdir():
            old.unlink()
        env = {**os.environ, **self.plan.env, JOB_DIR_ENV: self.job_dir, TRAINER_ENV: str(attempt),
               HEARTBEAT_DIR_ENV: str(beats), HEARTBEAT_INTERVAL_ENV: str(self.timings.report_every),
               **attempt_env(attempt, record)}
        if int(env.get("OMP_NUM_THREADS", "0") or 0) <= 0:
            env["OMP_NUM_THREADS"] = str(thread_budget(self.plan.workers))
        # The attempt's place in the job, as config overrides: this node's rank, rank 0's rendezvous, every node's
        # address in rank order (a spare or a new rank 0 changes all three).
        argv = [*self.plan.argv, "DDP_CONFIG.WORLD_RANK", str(rank), "DDP_CONFIG.DIST_URL", record.rendezvous,
                "DDP_CONFIG.WOLRD_URLS", json.dumps(list(record.world_urls))]
        self.say(f"attempt {attempt}: starting the trainer as node rank {rank} of {len(record.assignment)}, "
                 f"rendezvous {record.rendezvous}")
        self.started_attempts.add(attempt)
        self.trouble, self.stop_deadline = None, None
        self.trainer = Trainer(attempt=attempt, state=TrainerState.RUNNING, rank=rank, pid=None, rc=None,
                               started=time.time(), ended=None)
        try:
            # Its own process group: stopping this attempt never touches the supervisor.
            self.proc = subprocess.Popen(argv, cwd=self.job_dir, env=env, start_new_session=True)
        except OSError as exc:
            self.say(f"cannot start the trainer: {exc}")
            self._exited(127)
            return
        self.trainer = dataclasses.replace(self.trainer, pid=self.proc.pid)

    def _exited(self, rc: int) -> None:
        self.trainer = dataclasses.replace(self.trainer, state=TrainerState.EXITED, rc=rc, ended=time.time())

    def stop(self, reason: str, sig: int) -> None:
        """Stop the trainer: ``sig`` now, SIGKILL after the stop grace (SIGKILL now for a frozen trainer)."""
        if not self.running or self.stop_deadline is not None:
            return
        self.say(f"stopping the trainer: {reason}")
        grace = 0.0 if sig == signal.SIGKILL else self.plan.watch.stop_grace
        self.stop_deadline = time.monotonic() + grace
        procs.signal_all(procs.job_processes(self.job_dir, trainers_only=True), sig)

    def checkpoint_and_stop(self, kind: Kind, reason: str) -> None:
        """A user's stop or a preemption: the trainer checkpoints at a common step and exits (SIGUSR1)."""
        self.stop_asked = True
        if self.running and self.trainer.attempt is not None:
            self.trouble = Trouble(attempt=self.trainer.attempt, kind=kind, reason=reason, at=time.time())
            self.stop(reason, signal.SIGUSR1)

    # -- watching --------------------------------------------------------------------------------------------------

    def poll(self) -> None:
        if not self.running or self.proc is None:
            return
        rc = self.proc.poll()
        left = procs.job_processes(self.job_dir, trainers_only=True)
        if rc is not None and not left:
            self._exited(rc)
            self.say(f"attempt {self.trainer.attempt}: the trainer exited with status {rc}")
            self.stop_deadline = None
            return
        if self.stop_deadline is not None and time.monotonic() >= self.stop_deadline:
            procs.signal_all(left, signal.SIGKILL)
            return
        frozen = self._frozen()
        if frozen is not None and self.trouble is None and self.trainer.attempt is not None:
            pid, age = frozen
            reason = f"its trainer (pid {pid}) is frozen: no heartbeat for {age:.0f} s"
            self.trouble = Trouble(attempt=self.trainer.attempt, kind=Kind.FROZEN, reason=reason,
                                   at=time.time() - age)
            self.say(reason)
            self.stop(reason, signal.SIGKILL)  # a frozen process cannot exit cleanly

    def _frozen(self) -> tuple[int, float] | None:
        """(pid, seconds) of a live training process whose heartbeat is older than the heartbeat timeout."""
        folder = Path(self.job_dir) / layout.HEARTBEAT_DIR
        for beat in folder.iterdir() if folder.is_dir() else []:
            try:
                pid, written = int(beat.name), float(beat.read_text())
            except (OSError, ValueError):
                continue  # being written, or not a heartbeat
            age = time.monotonic() - written
            if age > self.timings.loss and Path(f"/proc/{pid}").exists():
                return pid, age
        return None

    def kill_now(self) -> None:
        """Every training process of the job on this node, now (the supervisor is going away)."""
        procs.end(self.job_dir, 0.0, trainers_only=True, first=signal.SIGKILL)

    # -- telling the hub -------------------------------------------------------------------------------------------

    def progress(self) -> JsonObject | None:
        """The run's progress as this node's trainer last wrote it (status.json; what the follow shows), cut to the
        follow's fields when it has grown large."""
        progress = read_json(self.plan.paths.status_file)
        if progress is not None and len(json.dumps(progress)) > PROGRESS_LIMIT:
            progress = {key: progress[key] for key in PROGRESS_KEYS if key in progress}
        return progress

    def port_offer(self) -> int | None:
        with contextlib.suppress(OSError):
            return free_port(self.plan.me.ip)
        return None
