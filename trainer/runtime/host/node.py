"""This node's trainer, one attempt at a time: started, moved on in place, and stopped to match the job's record, and
watched.

The supervisor calls ``reconcile`` with every record it hears and ``poll`` every tick; the node starts the trainer for
an attempt that assigns it a rank (once per attempt), stops it when the record no longer wants it, notices when it
exits or freezes, and says so in ``trainer``, ``trouble``, ``timeline`` and ``pace`` (what its steps spend their time
on: trainer.runtime.job.pace, from the trainer's heartbeats), which go to the hub in the member's reports.

Restart in place (the plan's ``restarts.in_place``, trainer/inplace.py): when an attempt is over, the trainer is told
so in the channel (trainer.runtime.host.channel) instead of being stopped; it tears down its process group and parks,
keeping its interpreter, model and data loaders, and the next attempt is handed to it in the channel. A node whose
trainer is gone starts the next attempt in its standby: a trainer process started ahead of need (once the trainer has
taken its first step, so as not to slow its start), which has done its imports and waits to be handed an attempt.
Without either, a new process. A trainer that does not park within the plan's stop grace after it was told to leave
is killed, and the next attempt starts without it (the timeline's ``fallback`` says why, and the attempt's ``killed``).

A trainer whose rank the hub names hung (trainer.runtime.job.verdict.hung: from the ranks' progress, ``ranks``, which
each process's heartbeat carries) gets SIGKILL, as a frozen one: its main thread is stuck, so it can neither park nor
stop. Unlike a frozen one (stopped, it could write nothing) it is first asked for its threads' stacks
(contract.STACKS_SIGNAL), as is a trainer that outlives its stop grace: where it was stuck is in its log. On nccl each
trainer keeps PyTorch's flight recorder, which dumps into the attempt's folder of the job's ``flight/`` on a
collective's timeout or error (contract.nccl_env); the attempt's timeline lists the dumps.

Stopping: a trainer that is stopped because the job no longer wants it gets SIGTERM; one whose attempt stops for a
user, a preemption or a straggler's swap (trainer.runtime.job.straggler), here or on any node of the attempt, gets
SIGUSR1 (the trainer then checkpoints at a step every rank agrees on and exits with status 75); a frozen or hung one
gets SIGKILL. Whatever is left after the plan's stop grace gets SIGKILL (after its stacks), and the attempt's timeline
says so (``killed``): never the normal path.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainer.runtime import layout
from trainer.runtime.contract import (
    ATTEMPT_ENV,
    ATTEMPT_FIELDS,
    CHANNEL_ENV,
    HEARTBEAT_DIR_ENV,
    HEARTBEAT_INTERVAL_ENV,
    IN_PLACE_ENV,
    JOB_DIR_ENV,
    PARENT_ENV,
    STACKS_S,
    STACKS_SIGNAL,
    STANDBY_ENV,
    TRAINER_ENV,
    flight_dump,
    nccl_env,
    thread_budget,
)
from trainer.runtime.host import channel, procs
from trainer.runtime.host.beats import Heartbeats
from trainer.runtime.host.channel import PHASES, Join, Notice, ProcessReport, ProcState, Who
from trainer.runtime.host.nodestate import read_json
from trainer.runtime.host.ports import free_port
from trainer.runtime.job.pace import Pace
from trainer.runtime.job.record import JobRecord, Kind, NodeTimeline, Phase, Start
from trainer.runtime.job.verdict import exit_failure
from trainer.runtime.plan import NodePlan
from trainer.runtime.schema import JsonObject
from trainer.runtime.watch.messages import IDLE, RankProgress, Trainer, TrainerState, Trouble

PROGRESS_LIMIT = 16 * 1024  # bytes of rank 0's status.json a report carries whole (the watch's lines are bounded)
PROGRESS_KEYS = ("state", "epoch", "epochs", "step", "steps_per_epoch", "metrics", "clips_per_s", "eta_s")
FLIGHT_DIR = "flight"  # in the job's folder, on nccl: the flight recorder's dumps, a folder per attempt


def attempt_told(attempt: int, record: JobRecord) -> dict[str, Any] | None:
    """The trainer's account of what ended the attempt before this one (contract.ATTEMPT_FIELDS), if one did."""
    cause = record.cause
    if cause is None:
        return None
    told = {"attempt": attempt, "cause": cause.kind.value, "node": cause.node, "detected_at": cause.detected_at,
            "detect_s": cause.detect_s, "failed_step": cause.failed_step}
    assert told.keys() == ATTEMPT_FIELDS.keys()
    return told


# Attempts that stop at a checkpoint of a step every rank agrees on (trainer.coordination): a straggler's swap, and a
# user's stop or a preemption of any node. Every trainer must stay in the attempt to agree: one torn out of it first
# (told to leave, as after a failure) fails the others' agreement, and the checkpoint is never written.
CHECKPOINTED = (Kind.SLOW, Kind.STOPPED, Kind.PREEMPTED)


def stop_signal(record: JobRecord) -> signal.Signals:
    """How the record wants a trainer stopped: SIGUSR1 (a checkpoint at a common step first) when the attempt stops
    for a checkpoint (CHECKPOINTED), SIGTERM otherwise (the attempt failed: its peers are gone or going)."""
    checkpointed = record.first_failure is not None and record.first_failure.kind in CHECKPOINTED
    return signal.SIGUSR1 if checkpointed else signal.SIGTERM


class Node:
    def __init__(self, plan: NodePlan, say: Callable[[str], None]) -> None:
        self.plan = plan
        self.timings = plan.timings
        self.job_dir = plan.paths.job_dir
        self.channel = str(Path(self.job_dir) / layout.CHANNEL_DIR)
        self.in_place = plan.restarts.in_place
        self.say = say
        self.proc: subprocess.Popen[bytes] | None = None  # the trainer of the current attempt
        self.standby: subprocess.Popen[bytes] | None = None  # the next attempt's trainer, imported and waiting
        self.trainer: Trainer = IDLE
        self.trouble: Trouble | None = None  # what this node saw go wrong in its current attempt
        self.started_attempts: set[int] = set()
        self.stop_deadline: float | None = None
        self.leave_deadline: float | None = None  # the trainer was told its attempt is over: it parks by then
        self.stop_asked = False  # a user's stop or a preemption: the trainer must not be started again here
        self.last_pace: Pace | None = None  # its trainer's effort as last read (kept after it exits)
        self.start_how = Start.PROCESS  # how the trainer came to its current attempt
        self.start_fallback = ""  # why not in place, when a trainer ran the attempt before here
        self.fallback = ""  # why the current trainer will not go on in place (said at the next start)
        self.killed = ""  # why the current attempt's trainer had to be killed after the stop grace
        self.graceful = False  # the current stop gives the trainer the stop grace (not SIGKILL at once)
        self.flight = str(Path(self.job_dir) / FLIGHT_DIR) if plan.backend == "nccl" else None
        self.job_over = False  # the record says the job has ended
        self.reports: list[ProcessReport] = []  # the trainer's processes about themselves, as of the last poll
        self.reached: dict[str, float] = {}  # phase -> when every process of the current attempt had reached it
        self.micro_batches: int | None = None  # of the current attempt's optimizer steps, as its processes said
        self.step_before: float | None = None  # their last step before this attempt (they went on in place)
        self.heartbeats = Heartbeats(self.job_dir, self.timings)  # what its training processes' heartbeats say
        self.wake_fd = channel.wake_reader(channel.make_folder(self.channel))  # a trainer's report wakes the tick

    @property
    def running(self) -> bool:
        return self.trainer.running

    @property
    def live(self) -> bool:
        """A trainer process is there: training, or parked."""
        return self.trainer.state in (TrainerState.RUNNING, TrainerState.PARKED)

    # -- matching the record ---------------------------------------------------------------------------------------

    def reconcile(self, record: JobRecord) -> None:
        attempt, rank = record.attempt, record.rank_of(self.plan.node)
        hung = record.first_failure
        if (hung is not None and hung.kind == Kind.HUNG and hung.node == self.plan.node and self.running
                and self.trainer.attempt == attempt):
            self._fell_back("its trainer hung")
            self.stop(hung.reason, STACKS_SIGNAL)  # its main thread is stuck: it can neither park nor stop
        wanted = record.end is None and record.phase == Phase.RUNNING and rank is not None and not self.stop_asked
        self.job_over = record.end is not None
        state = self.trainer.state
        if wanted and rank is not None and attempt not in self.started_attempts:
            if state == TrainerState.RUNNING:
                self.leave(f"attempt {self.trainer.attempt} is over")  # parks first; the next reconcile moves it
            elif state == TrainerState.PARKED:
                self.resume(attempt, rank, record)
            else:
                self.start(attempt, rank, record)
        elif self.live and (not wanted or self.trainer.attempt != attempt):
            why = record.end.reason if record.end is not None else f"attempt {self.trainer.attempt} is over"
            if state == TrainerState.RUNNING and stop_signal(record) == signal.SIGUSR1:
                self.stop(why, signal.SIGUSR1)  # every rank checkpoints at a common step first
            elif record.end is not None or self.stop_asked:
                self.stop(why, signal.SIGTERM)
            elif state == TrainerState.RUNNING:
                # Out of the world too (lost, replaced): parked, it can join again at once (a node back, a spare now).
                self.leave(why)

    def _env(self, attempt: str) -> dict[str, str]:
        beats = Path(self.job_dir) / layout.HEARTBEAT_DIR
        env = {**os.environ, **self.plan.env, JOB_DIR_ENV: self.job_dir, TRAINER_ENV: attempt,
               HEARTBEAT_DIR_ENV: str(beats), HEARTBEAT_INTERVAL_ENV: str(self.timings.report_every),
               CHANNEL_ENV: self.channel, PARENT_ENV: str(os.getpid())}
        if self.in_place:
            env[IN_PLACE_ENV] = "1"
        if self.flight is not None:
            given = {k: v for k, v in env.items() if k.startswith("TORCH_")}  # a user's setting wins
            env.update({**nccl_env(self.flight, attempt, self.in_place), **given})
            Path(flight_dump(self.flight, attempt)).parent.mkdir(parents=True, exist_ok=True)
        if int(env.get("OMP_NUM_THREADS", "0") or 0) <= 0:
            env["OMP_NUM_THREADS"] = str(thread_budget(self.plan.workers))
        return env

    def _popen(self, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes] | None:
        try:
            # Its own process group: stopping this attempt never touches the supervisor.
            return subprocess.Popen(argv, cwd=self.job_dir, env=env, start_new_session=True)
        except OSError as exc:
            self.say(f"cannot start the trainer: {exc}")
            return None

    def _begin(self, attempt: int, rank: int, how: Start, pid: int | None) -> None:
        self.started_attempts.add(attempt)
        self.trouble, self.stop_deadline, self.leave_deadline = None, None, None
        self.start_how, self.start_fallback, self.fallback, self.killed = how, self.fallback, "", ""
        self.reached, self.micro_batches, self.step_before = {}, None, None
        self.trainer = Trainer(attempt=attempt, state=TrainerState.RUNNING, rank=rank, pid=pid, rc=None,
                               started=time.time(), ended=None)

    def start(self, attempt: int, rank: int, record: JobRecord) -> None:
        """A trainer process for the attempt: the standby when one waits, else a new one."""
        beats = Path(self.job_dir) / layout.HEARTBEAT_DIR
        beats.mkdir(exist_ok=True)
        for old in beats.iterdir():
            old.unlink()
        folder = channel.make_folder(self.channel)
        standby = self.standby if self.standby is not None and self.standby.poll() is None else None
        channel.forget(folder, [standby.pid] if standby is not None else [])
        told = attempt_told(attempt, record)
        join = Join(attempt=attempt, who=Who.STANDBY, rank=rank, rendezvous=record.rendezvous,
                    world_urls=record.world_urls, told=told)
        how = "its standby" if standby is not None else "the trainer"
        self.say(f"attempt {attempt}: starting {how} as node rank {rank} of {len(record.assignment)}, "
                 f"rendezvous {record.rendezvous}")
        if standby is not None:
            self.proc, self.standby = standby, None
            self._begin(attempt, rank, Start.STANDBY, standby.pid)  # started before it can read the notice
            channel.write(folder / channel.NOTICE_FILE, Notice(over=attempt - 1, join=join))
            return
        env = self._env(str(attempt))
        if told is not None:
            env[ATTEMPT_ENV] = json.dumps(told)
        self.proc = self._popen([*self.plan.argv, *join.overrides()], env)
        self._begin(attempt, rank, Start.PROCESS, self.proc.pid if self.proc is not None else None)
        if self.proc is None:
            self._exited(127)

    def resume(self, attempt: int, rank: int, record: JobRecord) -> None:
        """The parked trainer joins the attempt in place: its processes read the notice and form the new group."""
        join = Join(attempt=attempt, who=Who.SURVIVORS, rank=rank, rendezvous=record.rendezvous,
                    world_urls=record.world_urls, told=attempt_told(attempt, record))
        self.say(f"attempt {attempt}: the trainer goes on in place as node rank {rank} of {len(record.assignment)}, "
                 f"rendezvous {record.rendezvous}")
        self._begin(attempt, rank, Start.IN_PLACE, self.trainer.pid)  # started before it can read the notice
        channel.write(Path(self.channel) / channel.NOTICE_FILE, Notice(over=attempt - 1, join=join))

    def leave(self, reason: str) -> None:
        """The trainer's attempt is over: it parks in place (told in the channel), or is stopped without restart in
        place."""
        if not self.in_place:
            self.stop(reason, signal.SIGTERM)
            return
        if not self.running or self.leave_deadline is not None or self.stop_deadline is not None:
            return
        attempt = self.trainer.attempt
        assert attempt is not None
        self.say(f"attempt {attempt} is over ({reason}): the trainer leaves it and waits in place")
        channel.write(Path(self.channel) / channel.NOTICE_FILE, Notice(over=attempt, join=None))
        self.leave_deadline = time.monotonic() + self.plan.watch.stop_grace

    def _fell_back(self, why: str) -> None:
        """Why this node's trainer of the current attempt will not go on in place (said in the next timeline); the
        first reason given stands (a trainer killed for not leaving in time exits killed)."""
        if self.in_place and not self.fallback:
            self.fallback = f"{why} (attempt {self.trainer.attempt})"

    def _exited(self, rc: int | None) -> None:
        self._fell_back(exit_failure(rc)[1])
        self.trainer = dataclasses.replace(self.trainer, state=TrainerState.EXITED, rc=rc, ended=time.time())
        self.leave_deadline = self.stop_deadline = None

    def stop(self, reason: str, sig: int) -> None:
        """Stop the trainer: ``sig`` now, SIGKILL after the stop grace; STACKS_SIGNAL (a hung trainer): SIGKILL once it
        wrote its stacks; SIGKILL (a frozen one): now."""
        if not self.live or self.stop_deadline is not None:
            return
        self.say(f"stopping the trainer: {reason}")
        grace = {signal.SIGKILL: 0.0, STACKS_SIGNAL: STACKS_S}.get(sig, self.plan.watch.stop_grace)
        self.stop_deadline, self.graceful = time.monotonic() + grace, sig not in (signal.SIGKILL, STACKS_SIGNAL)
        self.leave_deadline = None
        procs.signal_all(self._trainer_processes(), sig)

    def checkpoint_and_stop(self, kind: Kind, reason: str) -> None:
        """A user's stop or a preemption: the trainer checkpoints at a common step and exits (SIGUSR1); a parked one
        has nothing to checkpoint, and is stopped."""
        self.stop_asked = True
        if self.trainer.state == TrainerState.PARKED:
            self.stop(reason, signal.SIGTERM)
        elif self.running and self.trainer.attempt is not None:
            self.trouble = Trouble(attempt=self.trainer.attempt, kind=kind, reason=reason, at=time.time())
            self.stop(reason, signal.SIGUSR1)

    # -- watching --------------------------------------------------------------------------------------------------

    def _trainer_processes(self) -> list[int]:
        """The job's training processes here, but the standby's (it waits for the next attempt)."""
        spare = self.standby.pid if self.standby is not None else None
        return [pid for pid in procs.job_processes(self.job_dir, trainers_only=True) if pid != spare]

    def _kill_trainer(self) -> None:
        """SIGKILL to every training process of the job here (the standby's aside)."""
        procs.signal_all(self._trainer_processes(), signal.SIGKILL)

    def poll(self) -> None:
        self.heartbeats.looked()
        self._keep_standby()
        if not self.live or self.proc is None:
            return
        rc = self.proc.poll()
        if rc is not None:
            # What a trainer leaves behind when it dies (its loader workers, which notice only seconds later, or
            # spawned workers) goes with it: its exit is news for the hub now.
            self._kill_trainer()
            attempt = self.trainer.attempt
            self._exited(rc)
            self.say(f"attempt {attempt}: the trainer exited with status {rc}")
            return
        self.reports = [r for r in channel.processes(self.channel) if procs.belongs(r.pid, self.job_dir)]
        self._note_phases()
        if self.stop_deadline is not None:
            if time.monotonic() >= self.stop_deadline:
                if self.graceful:
                    self._killed_after_grace("stop")
                    return
                self._kill_trainer()
            return
        if self.running and self._parked():
            self.say(f"attempt {self.trainer.attempt}: the trainer left it and waits in place")
            self.trainer = dataclasses.replace(self.trainer, state=TrainerState.PARKED, ended=time.time())
            self.leave_deadline = None
            return
        if self.leave_deadline is not None and time.monotonic() >= self.leave_deadline:
            grace = self.plan.watch.stop_grace
            self.say(f"the trainer did not leave attempt {self.trainer.attempt} within {grace:.0f} s: killing it")
            self._fell_back(f"its trainer did not leave its attempt within {grace:.0f} s")
            self._killed_after_grace("leave its attempt")
            self.leave_deadline = None
            return
        frozen = self.heartbeats.frozen()
        if frozen is not None and self.trouble is None and self.trainer.attempt is not None:
            pid, age = frozen
            reason = f"its trainer (pid {pid}) is frozen: no heartbeat for {age:.0f} s"
            self.trouble = Trouble(attempt=self.trainer.attempt, kind=Kind.FROZEN, reason=reason,
                                   at=time.time() - age)
            self.say(reason)
            self._fell_back("its trainer froze")
            self.stop(reason, signal.SIGKILL)  # a frozen process cannot exit cleanly

    def _killed_after_grace(self, what: str) -> None:
        """The trainer is killed because it did not ``what`` within the stop grace: on record (``killed``). It is asked
        for its stacks first, and SIGKILL follows STACKS_S later (``poll``)."""
        if not self.killed:
            self.killed = f"its trainer did not {what} within the {self.plan.watch.stop_grace:g} s stop grace: killed"
            self.say(self.killed)
        self.graceful = False
        procs.signal_all(self._trainer_processes(), STACKS_SIGNAL)
        self.stop_deadline = time.monotonic() + STACKS_S

    def _note_phases(self) -> None:
        """The phases every process of the attempt has reached, the accumulation they said and their last step before
        it (kept once said: a process that ends takes its report with it)."""
        mine = self._mine()
        if len(mine) < self.plan.workers:
            return
        for phase in PHASES:
            times = [r.phases.get(phase) for r in mine]
            if phase not in self.reached and None not in times:
                self.reached[phase] = max(t for t in times if t is not None)
        said = [r.micro_batches for r in mine if r.micro_batches is not None]
        if said:
            self.micro_batches = max(said)  # every rank of a world has as many (empty ones fill a short share)
        before = [r.step_before for r in mine if r.step_before is not None]
        if before:
            self.step_before = min(before)  # the node's pause is its longest

    def _mine(self) -> list[ProcessReport]:
        """The reports of this attempt's training processes (those with a rank in it)."""
        return [r for r in self.reports if r.attempt == self.trainer.attempt and r.rank is not None]

    def _parked(self) -> bool:
        mine = self._mine()
        return len(mine) >= self.plan.workers and all(r.state == ProcState.PARKED for r in mine)

    def ranks(self) -> tuple[RankProgress, ...]:
        """Where each rank of the running attempt is (trainer.runtime.host.beats.Heartbeats.ranks: every rank or
        none)."""
        return self.heartbeats.ranks(self._mine()) if self.running else ()

    def stalled(self) -> bool:
        """A rank's step has stalled (Heartbeats.stalled): the member reports at the waiting cadence."""
        return self.heartbeats.stalled(self.ranks())

    def _keep_standby(self) -> None:
        """A standby waits for the next attempt once the trainer has taken its first step (before that, its imports
        would slow the trainer's start), or at once on a node that trains nothing now (a spare)."""
        if not self.in_place or self.stop_asked or self.job_over:
            return
        if self.standby is not None:
            if self.standby.poll() is None:
                return
            self.standby = None
        timeline = self.timeline()
        if self.live and (timeline is None or timeline.first_step is None):
            return
        first = max(self.started_attempts, default=-1) + 1  # a notice for an attempt before it is an old one
        env = {**self._env("standby"), STANDBY_ENV: str(first)}
        channel.make_folder(self.channel)
        self.standby = self._popen(list(self.plan.argv), env)

    def standby_ready(self) -> bool:
        """A process waits here with its imports done, to be handed an attempt: the trainer parked in place, or a
        standby (it said so in the channel). This node can join a running attempt without its peers waiting on an
        interpreter's start."""
        if self.trainer.state == TrainerState.PARKED:
            return True
        if self.standby is None or self.standby.poll() is not None:
            return False
        try:
            report = channel.read(ProcessReport, Path(self.channel) / f"{self.standby.pid}.json")
        except channel.ChannelError:  # being written, or not to be trusted: not ready
            return False
        return report is not None and report.state == ProcState.STANDBY

    def kill_now(self) -> None:
        """Every training process of the job on this node, the standby's too, now (the supervisor is going away)."""
        procs.end(self.job_dir, 0.0, trainers_only=True, first=signal.SIGKILL)

    # -- telling the hub -------------------------------------------------------------------------------------------

    def timeline(self) -> NodeTimeline | None:
        """The trainer's timeline in its current attempt: a phase is reached once every training process of the node
        has reached it."""
        if self.trainer.attempt is None or self.trainer.started is None:
            return None
        reached = self.reached.get
        return NodeTimeline(start=self.start_how, fallback=self.start_fallback, started=self.trainer.started,
                            imported=reached("imported"), group=reached("group"), checkpoint=reached("checkpoint"),
                            first_step=reached("first_step"), killed=self.killed, flight=self._flight_dumps(),
                            micro_batches=self.micro_batches, step_before=self.step_before)

    def _flight_dumps(self) -> tuple[str, ...]:
        """The flight recorder's dumps of the current attempt here (nccl), kept with its record."""
        if self.flight is None or self.trainer.attempt is None:
            return ()
        folder = Path(flight_dump(self.flight, self.trainer.attempt)).parent
        return tuple(sorted(str(path) for path in folder.glob("*"))) if folder.is_dir() else ()

    def progress(self) -> JsonObject | None:
        """The run's progress as this node's trainer last wrote it (status.json; what the follow shows), cut to the
        follow's fields when it has grown large."""
        progress = read_json(self.plan.paths.status_file)
        if progress is not None and len(json.dumps(progress)) > PROGRESS_LIMIT:
            progress = {key: progress[key] for key in PROGRESS_KEYS if key in progress}
        return progress

    def pace(self) -> Pace | None:
        """Its trainer's effort in its current attempt, once every training process has one (the last one read,
        after the trainer exits)."""
        attempt = self.trainer.attempt
        if self.running and attempt is not None:
            effort = self.heartbeats.effort(self.plan.workers)
            if effort is not None:
                self.last_pace = Pace(attempt=attempt, effort=effort)
        return self.last_pace if self.last_pace is not None and self.last_pace.attempt == attempt else None

    def port_offer(self) -> int | None:
        with contextlib.suppress(OSError):
            return free_port(self.plan.me.ip)
        return None
