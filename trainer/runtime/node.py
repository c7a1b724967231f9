"""This node's trainer, one attempt at a time: started and stopped to match the job's record, and watched.

The supervisor calls ``reconcile`` with every record it hears and ``poll`` every moment; the node starts the trainer
for an attempt that assigns it a rank (once per attempt), stops it when the record no longer wants it, notices when it
exits or freezes, and says all of that in ``report``, which goes to the hub.

Stopping: a trainer that is stopped because the attempt is over gets SIGTERM; one stopped for a user or a
preemption gets SIGUSR1 (the trainer then checkpoints at a step every rank agrees on and exits with status 75); a
frozen one gets SIGKILL. Whatever is left after the plan's stop grace gets SIGKILL.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from trainer.runtime import layout, procs
from trainer.runtime.contract import (
    ATTEMPT_ENV,
    HEARTBEAT_DIR_ENV,
    HEARTBEAT_INTERVAL_ENV,
    JOB_DIR_ENV,
    TRAINER_ENV,
    thread_budget,
)
from trainer.runtime.nodestate import read_json
from trainer.runtime.plan import NodePlan


def free_port(ip: str) -> int:
    """A port nothing listens on at ``ip`` now: the next attempt's rendezvous, if this node becomes rank 0."""
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((ip, 0))
        return int(sock.getsockname()[1])


class Node:
    def __init__(self, plan: NodePlan, say: Callable[[str], None]) -> None:
        self.plan = plan
        self.job_dir = plan.paths.job_dir
        self.say = say
        self.interval = max(0.5, plan.watch.heartbeat_timeout / 6)
        self.proc: subprocess.Popen[bytes] | None = None
        self.trainer: dict[str, Any] = {"attempt": None, "state": "idle", "rc": None, "rank": None, "pid": None}
        self.failure: dict[str, Any] | None = None  # what this node saw go wrong in its current attempt
        self.started_attempts: set[int] = set()
        self.stop_deadline: float | None = None
        self.stop_asked = False  # a user's stop or a preemption: the trainer must not be started again here

    @property
    def running(self) -> bool:
        return self.trainer["state"] == "running"

    # -- matching the record ---------------------------------------------------------------------------------------

    def reconcile(self, record: Mapping[str, Any]) -> None:
        attempt, rank = record["attempt"], record["assignment"].get(self.plan.node)
        wanted = record["end"] is None and record["phase"] == "running" and rank is not None and not self.stop_asked
        if wanted and not self.running and attempt not in self.started_attempts:
            self.start(attempt, rank, record)
        elif self.running and (not wanted or self.trainer["attempt"] != attempt):
            why = record["end"]["reason"] if record["end"] else f"attempt {self.trainer['attempt']} is over"
            self.stop(why, signal.SIGTERM)

    def start(self, attempt: int, rank: int, record: Mapping[str, Any]) -> None:
        beats = Path(self.job_dir) / layout.HEARTBEAT_DIR
        beats.mkdir(exist_ok=True)
        for old in beats.iterdir():
            old.unlink()
        env = {**os.environ, **self.plan.env, JOB_DIR_ENV: self.job_dir, TRAINER_ENV: str(attempt),
               HEARTBEAT_DIR_ENV: str(beats), HEARTBEAT_INTERVAL_ENV: str(self.interval)}
        if int(env.get("OMP_NUM_THREADS", "0") or 0) <= 0:
            # Share the node's cores between its workers instead of every worker taking all of them.
            env["OMP_NUM_THREADS"] = str(thread_budget(self.plan.workers))
        cause = record["attempts"][-1].get("cause") if record["attempts"] else None
        if cause:
            env[ATTEMPT_ENV] = json.dumps({"attempt": attempt, **{k: cause.get(k) for k in (
                "node", "kind", "reason", "detected_at", "detect_s", "failed_step")}, "cause": cause.get("kind")})
        # The attempt's place in the job, as config overrides: this node's rank, rank 0's rendezvous, every node's
        # address in rank order (a spare or a new rank 0 changes all three).
        argv = [*self.plan.argv, "DDP_CONFIG.WORLD_RANK", str(rank), "DDP_CONFIG.DIST_URL", record["rendezvous"],
                "DDP_CONFIG.WOLRD_URLS", json.dumps(record["world_urls"])]
        self.say(f"attempt {attempt}: starting the trainer as node rank {rank} of {len(record['assignment'])}, "
                 f"rendezvous {record['rendezvous']}")
        self.started_attempts.add(attempt)
        self.failure, self.stop_deadline = None, None
        self.trainer = {"attempt": attempt, "state": "running", "rc": None, "rank": rank, "pid": None,
                        "started": time.time()}
        try:
            # Its own process group: stopping this attempt never touches the supervisor.
            self.proc = subprocess.Popen(argv, cwd=self.job_dir, env=env, start_new_session=True)
        except OSError as exc:
            self.say(f"cannot start the trainer: {exc}")
            self.trainer.update(state="exited", rc=127, ended=time.time())
            return
        self.trainer["pid"] = self.proc.pid

    def stop(self, reason: str, sig: int) -> None:
        """Stop the trainer: ``sig`` now, SIGKILL after the stop grace (SIGKILL now for a frozen trainer)."""
        if not self.running or self.stop_deadline is not None:
            return
        self.say(f"stopping the trainer: {reason}")
        grace = 0.0 if sig == signal.SIGKILL else self.plan.watch.stop_grace
        self.stop_deadline = time.monotonic() + grace
        procs.signal_all(procs.job_processes(self.job_dir, trainers_only=True), sig)

    def checkpoint_and_stop(self, kind: str, reason: str) -> None:
        """A user's stop or a preemption: the trainer checkpoints at a common step and exits (SIGUSR1)."""
        self.stop_asked = True
        if self.running:
            self.failure = {"attempt": self.trainer["attempt"], "kind": kind, "reason": reason, "at": time.time(),
                            "rc": None}
            self.stop(reason, signal.SIGUSR1)

    # -- watching --------------------------------------------------------------------------------------------------

    def poll(self) -> None:
        if not self.running or self.proc is None:
            return
        rc = self.proc.poll()
        left = procs.job_processes(self.job_dir, trainers_only=True)
        if rc is not None and not left:
            self.trainer.update(state="exited", rc=rc, ended=time.time())
            self.say(f"attempt {self.trainer['attempt']}: the trainer exited with status {rc}")
            self.stop_deadline = None
            return
        if self.stop_deadline is not None and time.monotonic() >= self.stop_deadline:
            procs.signal_all(left, signal.SIGKILL)
            return
        frozen = self._frozen()
        if frozen is not None and self.failure is None:
            pid, age = frozen
            reason = f"its trainer (pid {pid}) is frozen: no heartbeat for {age:.0f} s"
            self.failure = {"attempt": self.trainer["attempt"], "kind": "frozen", "reason": reason,
                            "at": time.time() - age, "rc": None}
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
            if age > self.plan.watch.heartbeat_timeout and Path(f"/proc/{pid}").exists():
                return pid, age
        return None

    def kill_now(self) -> None:
        """Every training process of the job on this node, now (the supervisor is going away)."""
        procs.end(self.job_dir, 0.0, trainers_only=True, first=signal.SIGKILL)

    # -- telling the hub -------------------------------------------------------------------------------------------

    def report(self, rank0: bool) -> dict[str, Any]:
        """What the hub needs to know of this node now (``rank0``: this node has rank 0 in the current attempt)."""
        report: dict[str, Any] = {"trainer": dict(self.trainer), "failure": self.failure}
        if rank0:
            report["progress"] = read_json(self.plan.paths.status_file)
        with contextlib.suppress(OSError):
            report["port_offer"] = free_port(self.plan.me.ip)
        return report
