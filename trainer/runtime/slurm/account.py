"""A Slurm job's folder on the login host, the batch step's typed account of the job in it, and Slurm's commands
(standard library only): what the batch step (trainer.runtime.slurm.allocation) and the login host's verbs
(trainer.runtime.slurm.login) share.

The login host's folder of a job holds (one writer each):
    plan.json, launch.json, experiment.yaml, secret   the launch (its paths; the job for the renderer; the config; key)
    job.sbatch, submitted.json                        slurm-submit (the batch script; the Slurm job id)
    slurm.json                                        the batch step (every allocation, the record to continue from,
                                                      the outcome: ``Account``), batch.log its output
    render/<slurm job>.<restart>/                     the renderer's output for one allocation
Every node of an allocation has its own folder beside it, as over SSH (trainer.runtime.layout), which the batch step
fills from the renderer's output. The jobs' folder must be in a home the login host and the compute nodes share.
"""

from __future__ import annotations

import dataclasses
import posixpath
import subprocess
import time
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from trainer.runtime import layout, schema
from trainer.runtime.host import nodestate
from trainer.runtime.job.hub import new_record
from trainer.runtime.job.record import Cause, EndState, JobRecord, RecordError
from trainer.runtime.job.requeue import Requeue
from trainer.runtime.plan import NodePlan

DESCRIPTION_FILE = layout.DESCRIPTION_FILE
EXPERIMENT_FILE = "experiment.yaml"
SCRIPT_FILE = "job.sbatch"
SUBMITTED_FILE = "submitted.json"
ACCOUNT_FILE = "slurm.json"
BATCH_LOG = "batch.log"
RENDER_DIR = "render"


class SlurmError(RuntimeError):
    """A Slurm command failed, or the allocation is not what the job needs: the message says which and why."""


def say(message: str) -> None:
    """A line in the batch step's log (batch.log) or a member's train.log."""
    print(f"slurm: {message} at {time.strftime('%F %T')}", flush=True)


def run(argv: list[str], **kwargs: Any) -> str:
    """A Slurm command's output, or SlurmError with its words."""
    try:
        out = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120, **kwargs)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SlurmError(f"{argv[0]}: {exc}") from None
    if out.returncode != 0:
        words = "; ".join(line.strip() for line in out.stderr.splitlines() if line.strip())
        raise SlurmError(f"{' '.join(argv[:3])} failed: {words or f'exit status {out.returncode}'}")
    return out.stdout


def read_json(path: str | Path) -> dict[str, Any]:
    return nodestate.read_json(path) or {}


# ---------------------------------------------------------------------------------------------------------------------
# The batch step's account (slurm.json)


class Action(StrEnum):
    """What the batch step did when an allocation ended: requeued the job, or let its end stand (EndState's words)."""

    REQUEUE = "requeue"
    FINISHED = EndState.FINISHED.value
    FAILED = EndState.FAILED.value
    STOPPED = EndState.STOPPED.value


@dataclass(frozen=True)
class Ended:
    at: float
    action: Action
    why: str


@dataclass(frozen=True)
class Allocation:
    restart: int  # SLURM_RESTART_COUNT
    batch_host: str  # the first node: the batch step, rank 0 and the hub
    members: tuple[str, ...]  # the allocation's nodes, the batch host first
    started_at: float
    ended: Ended | None  # None (absent from slurm.json) until the batch step decided, or when its batch host was lost


@dataclass(frozen=True)
class Next:
    """The record the next allocation continues (``continued``): the one before, what ended it, whether it counts."""

    previous: JobRecord | None  # None: the lost allocation's members kept none
    cause: Cause
    counted: bool


@dataclass(frozen=True)
class Outcome:
    state: EndState
    reason: str
    at: float


@dataclass(frozen=True)
class Account:
    """slurm.json: the batch step's account of one Slurm job, across its allocations (one batch step at a time)."""

    slurm_job: str
    allocations: tuple[Allocation, ...]
    record: JobRecord | None  # the latest allocation's first record (None: it has none yet)
    next: Next | None  # set when the job is requeued
    outcome: Outcome | None  # set when the job's end stands

    def started(self, allocation: Allocation) -> Account:
        """A new allocation of the job runs: it has no outcome yet."""
        return dataclasses.replace(self, allocations=(*self.allocations, allocation), outcome=None)

    def continuing(self, record: JobRecord) -> Account:
        """The allocation continues the job with ``record`` (``continued``'s)."""
        return dataclasses.replace(self, record=record, next=None)

    def ended(self, state: EndState, reason: str, at: float) -> Account:
        """The job's end stands, and so does the latest allocation's."""
        return dataclasses.replace(self, outcome=Outcome(state, reason, at))._ending_last(
            Ended(at, Action(state.value), reason))

    def requeued(self, decided: Requeue, previous: JobRecord | None, at: float) -> Account:
        """The latest allocation ended with ``decided``: the next one continues from ``previous``."""
        return dataclasses.replace(self, next=Next(previous, decided.cause, decided.counted))._ending_last(
            Ended(at, Action.REQUEUE, decided.cause.reason))

    def _ending_last(self, ended: Ended) -> Account:
        *before, last = self.allocations
        return dataclasses.replace(self, allocations=(*before, dataclasses.replace(last, ended=ended)))

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = schema.dump(self)
        data["allocations"] = [allocation_json(a) for a in self.allocations]
        return data


def allocation_json(allocation: Allocation) -> dict[str, Any]:
    """An allocation as slurm.json holds it: without ``ended`` until it ended."""
    data: dict[str, Any] = schema.dump(allocation)
    if allocation.ended is None:
        del data["ended"]
    return data


def fresh_account(slurm_job: str) -> Account:
    return Account(slurm_job=slurm_job, allocations=(), record=None, next=None, outcome=None)


def read_account(login_dir: str, slurm_job: str) -> Account | None:
    """The batch step's account of Slurm job ``slurm_job`` (None: none yet, or only another job's); SlurmError naming
    the file when it does not follow the schema."""
    path = posixpath.join(login_dir, ACCOUNT_FILE)
    data = read_json(path)
    if data.get("slurm_job") != slurm_job:
        return None
    allocations = data.get("allocations")
    if isinstance(allocations, list):  # an allocation not yet ended has no ``ended``
        data["allocations"] = [{"ended": None, **a} if isinstance(a, dict) else a for a in allocations]
    try:
        return schema.parse(Account, data, path)
    except schema.SchemaError as exc:
        raise SlurmError(str(exc)) from None


def write_account(login_dir: str, account: Account) -> None:
    nodestate.write_json(posixpath.join(login_dir, ACCOUNT_FILE), account.to_json())


def continued(plan: NodePlan, after: Next | None, wall: float) -> JobRecord:
    """The record an allocation starts with: the launch's (attempt 0) for the first, else the next attempt after the
    previous allocation's record (``after``), with its attempts and restarts carried on and this allocation's nodes,
    ranks and rendezvous."""
    fresh = new_record(plan, wall)
    if after is None:
        return fresh
    previous = after.previous
    if previous is None:
        raise RecordError("the allocation before's record: its members kept none")
    attempt = previous.attempt + 1
    entry = dataclasses.replace(fresh.attempts[0], attempt=attempt, cause=after.cause)
    return dataclasses.replace(fresh, attempt=attempt, attempts=(*previous.attempts, entry),
                               restarts=previous.restarts + int(after.counted))
