"""The channel between a node's supervisor and its training processes: files in the node's job folder, ``channel/``
(trainer.runtime.layout), which the supervisor makes readable and writable by the job's user alone.

Each training process reports itself in ``<pid>.json`` (``ProcessReport``, written by trainer/timeline.py): the attempt
it belongs to, its global rank, its state (a standby: imported and waiting to be handed an attempt; training; parked:
its attempt is over, its process group torn down, and it waits in place for the next attempt), and the wall-clock time
it reached each phase of its attempt (``PHASES``). The supervisor (trainer.runtime.host.node) reads them every tick: a
node's phases are reached when every training process of the node has reached them.

A process that writes its report also writes a byte into the FIFO ``wake``, which the supervisor's loop reads: the
supervisor acts on a parked trainer, or a phase reached, at once rather than at its next tick.

The supervisor writes ``next-attempt.json`` (``Notice``): the newest attempt that is over (its processes leave it and
park), and the next attempt to join (``Join``): who joins it (the parked survivors, or the standby), as which node
rank, at which rendezvous, with which nodes, and what ended the attempt before (contract.ATTEMPT_FIELDS). A trainer
polls the file (a stat per optimizer step, 20 times a second while it waits): a signal would not reach a process
blocked in a collective any sooner, and a file survives the moment between a process's start and its first look.

Why the files can be trusted: they are local, and ``read`` takes a file only when it and its folder belong to the
reading process's own user and nobody else may write them; anything else is refused (``ChannelError``), as is a file
that does not follow its schema (trainer.runtime.schema).
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, TypeVar

from trainer.runtime import atomic, schema
from trainer.runtime.schema import JsonObject

NOTICE_FILE = "next-attempt.json"
WAKE_FIFO = "wake"  # a byte written here wakes the supervisor at once (its tick would notice within TICK anyway)
# The phases of an attempt in one process, in order: the process started (or was handed the attempt), its imports
# done, its process group formed, the checkpoint chosen and loaded (or none found), its first optimizer step done.
PHASES = ("started", "imported", "group", "checkpoint", "first_step")

T = TypeVar("T")


class ChannelError(schema.SchemaError):
    """A channel file that may not be trusted, or does not follow its schema (the message says which and why)."""


class ProcState(StrEnum):
    STANDBY = "standby"  # imported, waits to be handed an attempt
    TRAINING = "training"  # in its attempt (from its start to its end)
    PARKED = "parked"  # its attempt is over, its group torn down: it waits in place for the next one


@dataclass(frozen=True)
class ProcessReport:
    """A training process about itself (``<pid>.json``)."""

    pid: int
    attempt: int | None  # None: a standby not handed an attempt yet
    rank: int | None  # its global rank in the attempt (None until it has one)
    state: ProcState
    phases: dict[str, float]  # phase (PHASES) -> wall-clock time it was reached in this attempt
    micro_batches: int | None = None  # of each optimizer step in this attempt's world (trainer.elastic; None: not yet)
    step_before: float | None = None  # wall clock: its last optimizer step before this attempt (None: it took none)


class Who(StrEnum):
    SURVIVORS = "survivors"  # the node's parked training processes (restart in place)
    STANDBY = "standby"  # the node's standby process


@dataclass(frozen=True)
class Join:
    """The next attempt, for the processes it names."""

    attempt: int
    who: Who
    rank: int  # the node's rank in it
    rendezvous: str  # tcp://host:port
    world_urls: tuple[str, ...]  # the attempt's nodes' addresses in node-rank order
    told: JsonObject | None  # what ended the attempt before (contract.ATTEMPT_FIELDS), None for the launch's

    def overrides(self) -> list[str]:
        return attempt_overrides(self.rank, self.rendezvous, self.world_urls)


@dataclass(frozen=True)
class Notice:
    """The supervisor to its trainers (``next-attempt.json``)."""

    over: int  # attempts up to this one are over: their processes leave them and park (-1: none)
    join: Join | None


def attempt_overrides(rank: int, rendezvous: str, world_urls: Sequence[str]) -> list[str]:
    """An attempt's place in the job as the trainer's config overrides: the node's rank, rank 0's rendezvous, every
    node's address in rank order (a spare or a new rank 0 changes all three), and so their number (a smaller world:
    a node left with no spare to take its rank)."""
    return ["DDP_CONFIG.WORLD_RANK", str(rank), "DDP_CONFIG.DIST_URL", rendezvous,
            "DDP_CONFIG.WOLRD_URLS", json.dumps(list(world_urls)), "DDP_CONFIG.WORLD_SIZE", str(len(world_urls))]


def make_folder(folder: str | Path) -> Path:
    """The channel's folder, made (or made again) the job user's alone."""
    path = Path(folder)
    path.mkdir(mode=0o700, exist_ok=True)
    path.chmod(0o700)
    return path


def wake_reader(folder: str | Path) -> int:
    """The supervisor's end of the channel's FIFO (made if missing): open for reading and writing, so that it never
    reads an end of file while no trainer has it open; non-blocking."""
    path = Path(folder) / WAKE_FIFO
    if not path.exists():
        os.mkfifo(path, 0o600)
    if not stat.S_ISFIFO(path.lstat().st_mode):
        raise ChannelError(f"{path} is not a FIFO")
    return os.open(path, os.O_RDWR | os.O_NONBLOCK)


def wake(folder: str | Path) -> None:
    """Wake the supervisor (a byte into its FIFO); nothing when there is none, or nobody reads it."""
    try:
        fd = os.open(Path(folder) / WAKE_FIFO, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:  # no FIFO (a trainer under torchrun), or no supervisor reading it
        return
    try:
        os.write(fd, b".")
    except OSError:  # full: the supervisor has not read the last ones yet, and will tick anyway
        pass
    finally:
        os.close(fd)


def drain(fd: int) -> None:
    """Read what the FIFO holds (the bytes say nothing but "look")."""
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass


def write(path: str | Path, value: Any) -> None:
    """A dataclass of this module as JSON, replacing ``path`` in one rename (a reader never sees half a file); the
    file is its writer's alone (0600)."""
    atomic.write(path, json.dumps(schema.dump(value)))


def trusted(path: Path) -> None:
    """Refuse (ChannelError) a file, or a folder holding it, that is not this user's own, or that others may write."""
    for place in (path.parent, path):
        info = place.stat()
        if info.st_uid != os.geteuid():
            raise ChannelError(f"{place} belongs to uid {info.st_uid}, not to this process's user ({os.geteuid()})")
        if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise ChannelError(f"{place} may be written by other users (mode {stat.filemode(info.st_mode)})")


def read(cls: type[T], path: str | Path) -> T | None:
    """A channel file as ``cls``; None when there is none (ChannelError: one that may not be trusted, or is
    malformed)."""
    path = Path(path)
    try:
        trusted(path)
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ChannelError(f"{path}: cannot read it ({exc})") from None
    return schema.parse(cls, data, str(path), ChannelError)


def processes(folder: str | Path) -> list[ProcessReport]:
    """The processes' reports in the channel's folder; a report that cannot be read is skipped (a process writing its
    first one, or a stranger's file: the supervisor never acts on it)."""
    found = []
    for path in Path(folder).glob("*.json"):
        if not path.stem.isdigit():
            continue
        try:
            report = read(ProcessReport, path)
        except ChannelError:
            continue
        if report is not None and report.pid == int(path.stem):
            found.append(report)
    return found


def forget(folder: str | Path, keep: Sequence[int]) -> None:
    """Remove the reports of processes that are gone (all but ``keep``)."""
    for path in Path(folder).glob("*.json"):
        if path.stem.isdigit() and int(path.stem) not in keep:
            path.unlink(missing_ok=True)
