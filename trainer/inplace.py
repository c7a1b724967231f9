"""Restart in place, the trainer's side (the supervisor's: trainer.runtime.host.node; their channel:
trainer.runtime.host.channel).

A training process the runtime started with $VIDCLUSTER_IN_PLACE goes on when its attempt ends under it: a peer went
away (a collective failed), its group did not form, or its supervisor said the attempt is over (read after every
optimizer step and validation batch: ``InPlace.check``). It waits for the checkpoint it was writing, aborts its process
groups (distributed.abort_groups: a graceful destroy waits on a dead peer under nccl), says it is parked, and waits
until its supervisor hands it the next attempt; then it forms that attempt's group (its node's rank, the rendezvous and
the number of nodes may have changed) and goes on from the step it holds in memory when every rank of the attempt that
holds one holds the same one (a process new to the job receives it from a peer: trainer.continuation.shared_memory; the
recipe kept in another world: trainer.elastic), else resumes from the checkpoint every rank agrees on, as a new process
would, with its interpreter, model and data loaders kept (train.train_worker's loop).

A rank may be told its attempt is over while it waits in a collective whose peer is gone, or on a live peer that
left it, which nccl and gloo would wait in until DDP_CONFIG.TIMEOUT_SECONDS: a thread (``InPlace.abort_when_over``)
aborts its groups LEAVE_S after the word (under gloo by shutting the group's connections: distributed.abort_groups),
so the collective fails and the rank parks. Gloo has one wait that nothing but its timeout ends: a send posted on a
connection that has already failed (a rank thawed after its peers cut it off: gloo's tcp Pair::send does not look at
the pair's state). A rank still in its attempt STUCK_S after the abort, without having caught what ended it
(``InPlace.leaving``), ends with status 1 then, saying why: its supervisor starts the next attempt in its standby at
once, instead of killing it after the stop grace. A rank at work of its own (``OWN_WORK``: waiting for its loader's
batch, writing its checkpoint) is not stuck, however long that takes: its next collective fails at once; the STUCK_S
count starts when it leaves that work. (A checkpoint has collectives of its own: a rank wedged in one of those is
left to its supervisor's stop grace, as every stuck rank was before; a large checkpoint's write is the commoner wait.)

A standby (``standby_argv``) is a trainer process its supervisor starts ahead of need: it has imported what a trainer
imports, and waits here until it is handed an attempt; then it trains it as a process started for it would.

Either waits while its parent (the supervisor, or the launcher that spawned it) lives; a stop signal ends the wait.
Nothing here imports torch: the runtime's tests drive it with a stand-in trainer (tests/runtime/standin.py).
Without $VIDCLUSTER_IN_PLACE (torchrun, a run by hand) a process that loses its peers exits (status 1) and its
launcher starts it again.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from trainer import heartbeat
from trainer.runtime.contract import (
    ATTEMPT_ENV,
    CHANNEL_ENV,
    EXIT_PEER_LOST,
    FLIGHT_DUMP_ENV,
    FLIGHT_ENV,
    IN_PLACE_ENV,
    PARENT_ENV,
    STANDBY_ENV,
    TRAINER_ENV,
    flight_dump,
)
from trainer.runtime.host import channel
from trainer.runtime.host.channel import ChannelError, Join, Notice, ProcState, Who
from trainer.runtime.watch.messages import CHECKPOINT, DATA
from trainer.timeline import PROCESS

log = logging.getLogger("trainer")

POLL_S = 0.05  # a waiting process reads the notice this often
LEAVE_S = 1.0  # a rank told its attempt is over leaves it at its next step; one still in it after this is stuck
STUCK_S = 5.0  # after its groups were aborted, a rank's collective fails at once: one still in it then never leaves
OWN_WORK = (DATA, CHECKPOINT)  # phases (trainer.heartbeat.at) that wait on no peer: a slow batch or disk is no hang


class LeftAttempt(Exception):
    """The supervisor said this process's attempt is over."""


class ParentGone(Exception):
    """The process that started this one is gone: nobody will hand it an attempt."""


class Notices:
    """The supervisor's notice (channel.NOTICE_FILE), read again only when the file changed (one stat a look)."""

    def __init__(self, folder: str, say: Callable[[str], None]) -> None:
        self.path = Path(folder) / channel.NOTICE_FILE
        self.say = say
        self.seen: tuple[int, int] | None = None
        self.notice: Notice | None = None
        self.refused: set[str] = set()

    def current(self) -> Notice | None:
        try:
            info = self.path.stat()
        except OSError:
            return self.notice
        if (info.st_mtime_ns, info.st_size) != self.seen:
            self.seen = (info.st_mtime_ns, info.st_size)
            try:
                self.notice = channel.read(Notice, self.path)
            except ChannelError as exc:  # never acted on; said once
                if str(exc) not in self.refused:
                    self.refused.add(str(exc))
                    self.say(f"refused the supervisor's notice: {exc}")
        return self.notice

    def wait(self, taken: Callable[[Join], bool], stopped: Callable[[], bool]) -> Join:
        """The first join ``taken`` accepts; ParentGone when this process's parent ends, or a stop is asked for."""
        parent = expected_parent()
        while True:
            notice = self.current()
            if notice is not None and notice.join is not None and taken(notice.join):
                return notice.join
            if os.getppid() != parent or stopped():
                raise ParentGone("stopped while waiting for the next attempt")
            time.sleep(POLL_S)


def expected_parent() -> int:
    """The process that hands this one its attempts: named by $VIDCLUSTER_PARENT when whoever started this process
    set it (so a parent that died while this one imported is noticed), else this process's parent now."""
    named = os.environ.get(PARENT_ENV, "")
    return int(named) if named.isdigit() else os.getppid()


def take(join: Join) -> None:
    """This process now belongs to ``join``'s attempt: what a process started for it would find in its environment
    (spawned workers inherit it), and its timeline starts again."""
    os.environ[TRAINER_ENV] = str(join.attempt)
    if join.told is not None:
        os.environ[ATTEMPT_ENV] = json.dumps(join.told)
    else:
        os.environ.pop(ATTEMPT_ENV, None)
    flight = os.environ.get(FLIGHT_ENV)
    if flight:  # the flight recorder's dumps go with this attempt (torch reads the name when it first dumps)
        os.environ[FLIGHT_DUMP_ENV] = dump = flight_dump(flight, join.attempt)
        Path(dump).parent.mkdir(parents=True, exist_ok=True)
    PROCESS.begin(join.attempt)
    heartbeat.restart_progress()


def standby_argv(argv: list[str]) -> list[str]:
    """A standby (``$VIDCLUSTER_STANDBY``: the first attempt it may take) waits here until its supervisor hands it an
    attempt, then trains with that attempt's place in the job; any other process goes on at once."""
    first = os.environ.pop(STANDBY_ENV, None)
    folder = os.environ.get(CHANNEL_ENV)
    if first is None or not folder:
        return argv
    PROCESS.set(ProcState.STANDBY)
    notices = Notices(folder, lambda line: print(f"standby: {line}", file=sys.stderr, flush=True))
    try:
        join = notices.wait(lambda j: j.who == Who.STANDBY and j.attempt >= int(first), lambda: False)
    except ParentGone:
        raise SystemExit(0) from None
    take(join)
    return [*argv, *join.overrides()]


class InPlace:
    """A survivor's side of restart in place (see the module docstring)."""

    def __init__(self, folder: str) -> None:
        self.notices = Notices(folder, lambda line: log.warning("%s", line))
        self.left: int | None = None  # the last attempt whose work the main thread is out of (``leaving``)

    @classmethod
    def from_env(cls) -> InPlace | None:
        folder = os.environ.get(CHANNEL_ENV)
        return cls(folder) if os.environ.get(IN_PLACE_ENV) == "1" and folder else None

    def over(self, attempt: int | None) -> bool:
        """Whether the supervisor has said that ``attempt`` is over."""
        notice = self.notices.current()
        return attempt is not None and notice is not None and notice.over >= attempt

    def check(self, attempt: int | None) -> None:
        """LeftAttempt when the supervisor has said that ``attempt`` is over (after every step and validation batch)."""
        if self.over(attempt):
            raise LeftAttempt(f"the supervisor says attempt {attempt} is over")

    def abort_when_over(self, abort: Callable[[], None]) -> None:
        """From now on, a thread calls ``abort`` (distributed.abort_groups) once this process's attempt has been over
        for LEAVE_S and it still trains in it, and ends the process if it is still in it STUCK_S later (see the module
        docstring)."""
        watch = InPlace(str(self.notices.path.parent))  # its own reading of the notice: the main thread has one
        threading.Thread(target=watch._abort_when_over, args=(abort, self), name="vidcluster-leave",
                         daemon=True).start()

    def leaving(self) -> None:
        """The main thread has caught what ended its attempt (or failed it): it is out of the attempt's collectives."""
        self.left = PROCESS.attempt

    def _abort_when_over(self, abort: Callable[[], None], main: InPlace) -> None:
        told: tuple[int, float] | None = None  # (attempt, when the word was read)
        aborted: float | None = None  # when that attempt's groups were aborted
        while True:
            attempt = PROCESS.attempt
            if PROCESS.state == ProcState.TRAINING and main.left != attempt and self.over(attempt):
                assert attempt is not None
                now = time.monotonic()
                if told is None or told[0] != attempt:
                    told, aborted = (attempt, now), None
                elif aborted is None and now - told[1] >= LEAVE_S:
                    log.warning("attempt %d is over and this rank is still in it: aborting its process groups",
                                attempt)
                    abort()
                    aborted = now
                elif aborted is not None and self._stuck(aborted, now):
                    log.error("attempt %d is over and this rank is still in it %.0f s after its process groups were "
                              "aborted (a collective that only its timeout ends): ending this process so that its "
                              "supervisor starts the next attempt in its standby", attempt, STUCK_S)
                    logging.shutdown()
                    os._exit(EXIT_PEER_LOST)
            time.sleep(POLL_S)

    @staticmethod
    def _stuck(aborted: float, now: float) -> bool:
        """Whether the main thread has waited on its peers for STUCK_S since their groups were aborted at ``aborted``:
        since then, or since it left its own work."""
        place = heartbeat.where()
        return place.phase not in OWN_WORK and now - max(aborted, place.since) >= STUCK_S

    def next_attempt(self, attempt: int | None, stopped: Callable[[], bool]) -> Join:
        """Parked (the caller tore its group down): wait for the supervisor to hand this process a later attempt."""
        PROCESS.set(ProcState.PARKED)
        # Its heartbeat goes on while it waits: from now on it says "starting", not where the attempt over left it
        # (a rank that went on from memory joined in the second its member reported that stale place as the new
        # attempt's, and the hub named it hung).
        heartbeat.restart_progress()
        floor = -1 if attempt is None else attempt
        join = self.notices.wait(lambda j: j.who == Who.SURVIVORS and j.attempt > floor, stopped)
        take(join)
        return join
