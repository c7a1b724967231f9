"""A Slurm job from the login host (standard library only): its batch script and sbatch, its status and its wait, from
Slurm's queue (scontrol) and its hub's state in the shared home, and its stop (scancel).
trainer.runtime.slurm.allocation says what runs inside the allocation; trainer.runtime.slurm.account what both share.
"""

from __future__ import annotations

import json
import posixpath
import re
import time
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from trainer.runtime import layout, report, schema
from trainer.runtime.host import nodestate
from trainer.runtime.job.hub import new_record
from trainer.runtime.job.record import End, EndState, JobRecord, Phase
from trainer.runtime.plan import NodePlan
from trainer.runtime.slurm.account import (
    BATCH_LOG,
    SCRIPT_FILE,
    SUBMITTED_FILE,
    Outcome,
    SlurmError,
    allocation_json,
    read_account,
    read_json,
    run,
)
from trainer.runtime.watch.messages import Mode


class SlurmState(StrEnum):
    """The Slurm job states this runtime names (scontrol's JobState; Slurm has more, passed on as it says them)."""

    PENDING = "PENDING"
    CONFIGURING = "CONFIGURING"
    RUNNING = "RUNNING"
    COMPLETING = "COMPLETING"
    REQUEUED = "REQUEUED"
    REQUEUE_HOLD = "REQUEUE_HOLD"
    REQUEUE_FED = "REQUEUE_FED"
    RESIZING = "RESIZING"
    SUSPENDED = "SUSPENDED"
    STOPPED = "STOPPED"
    SIGNALING = "SIGNALING"
    STAGE_OUT = "STAGE_OUT"
    RESV_DEL_HOLD = "RESV_DEL_HOLD"
    CANCELLED = "CANCELLED"


# Slurm job states in which the job may still run (a requeued job passes through REQUEUED to PENDING).
LIVE = frozenset(s.value for s in SlurmState if s != SlurmState.CANCELLED)
UNKNOWN = "UNKNOWN"  # scontrol shows no JobState
GONE = "gone"  # the status's Slurm state once Slurm no longer knows the job


class Status(StrEnum):
    """The job's state in its status: trainer.runtime.host.nodestate.status's words for it."""

    NONE = "none"
    RUNNING = "running"
    FINISHED = EndState.FINISHED.value
    FAILED = EndState.FAILED.value
    STOPPED = EndState.STOPPED.value
    KILLED = "killed"  # a node's state: its supervisor is gone without hearing an end


@dataclass(frozen=True)
class Queue:
    """The Slurm job as scontrol shows it."""

    job_id: str
    state: str  # a SlurmState, or another of Slurm's words
    reason: str
    nodes: str
    run_time: str
    time_limit: str
    restarts: int


def batch_script(login: NodePlan, login_dir: str, options: dict[str, Any]) -> str:
    """The batch script: the training environment's Python runs it; #SBATCH lines say what the job asks of Slurm.
    Values are Python literals in it (json), never shell text."""
    for what, path in (("the environment's Python", login.paths.env_python), ("the job's folder", login_dir)):
        if re.search(r"\s", path):
            raise SlurmError(f"{what} {path!r} has a space: Slurm's #SBATCH lines and a script's #! cannot hold it")
    nodes = int(options["trainers"]) + int(options["spares"])
    asked = [f"--job-name=vidcluster-{login.job}", f"--nodes={nodes}", "--ntasks-per-node=1", "--requeue",
             "--no-kill", f"--signal=B:USR1@{int(options['signal_seconds'])}",
             f"--output={posixpath.join(login_dir, BATCH_LOG)}", "--open-mode=append", f"--chdir={login_dir}",
             *([f"--time={options['time']}"] if options.get("time") else []), *options.get("site_options", [])]
    min_nodes = options.get("min_nodes")  # vidcluster_min_nodes; left out (None): every trainer
    settings = {"trainers": int(options["trainers"]), "iface": str(options.get("iface", "")),
                **({} if min_nodes is None else {"min_nodes": int(min_nodes)})}
    return "\n".join([
        f"#!{login.paths.env_python} -{''.join(flag.lstrip('-') for flag in layout.RUNTIME_FLAGS)}",
        *(f"#SBATCH {option}" for option in asked),
        f'"""VidCluster job {login.job}: its batch step (trainer.runtime.slurm.allocation; slurm-submit wrote it)."""',
        "import sys",
        f"sys.path.insert(0, {json.dumps(login.paths.code_dir)})",
        "from trainer.runtime.slurm import allocation as slurm  # noqa: E402",
        f"sys.exit(slurm.batch({json.dumps(login_dir)}, {json.dumps(settings)}))",
        "",
    ])


def submit(login_dir: str, options: dict[str, Any]) -> dict[str, Any]:
    login = NodePlan.read(posixpath.join(login_dir, layout.PLAN_FILE))
    script = Path(login_dir) / SCRIPT_FILE
    script.write_text(batch_script(login, login_dir, options))
    script.chmod(0o750)
    slurm_job = run(["sbatch", "--parsable", str(script)], cwd=login_dir).strip().split(";")[0]
    nodestate.write_json(posixpath.join(login_dir, SUBMITTED_FILE),
                         {"slurm_job": slurm_job, "submitted_at": time.time(), **options})
    return {"changed": True, "slurm_job": slurm_job, "script": str(script)}


def queue_state(slurm_job: str) -> Queue | None:
    """The Slurm job as scontrol shows it (state, reason, nodes, run time, time limit, restarts), None when Slurm no
    longer knows it."""
    try:
        shown = run(["scontrol", "--oneliner", "show", "job", slurm_job])
    except SlurmError:
        return None
    fields = dict(re.findall(r"(\w+)=(\S*)", shown))
    return Queue(job_id=slurm_job, state=fields.get("JobState", UNKNOWN), reason=fields.get("Reason", ""),
                 nodes=fields.get("NodeList", ""), run_time=fields.get("RunTime", ""),
                 time_limit=fields.get("TimeLimit", ""), restarts=int(fields.get("Restarts", "0") or 0))


def judged(known: JobRecord | None, launched: JobRecord, previous: JobRecord | None, outcome: Outcome | None,
           queue: Queue | None, slurm_job: str) -> tuple[Status, JobRecord, bool]:
    """(the job's state, the record its status shows, whether its trainers run now), from the freshest record the
    members or the batch step hold (``known``; else the launch's), the batch step's ``outcome``, and Slurm's
    ``queue`` (queue_state's; None: Slurm no longer knows the job). While the job is in Slurm's hands its record
    (``previous``: the one a requeue continues, else the known one) waits, and says for what."""
    record = known or launched
    if outcome is not None:
        return Status(outcome.state.value), record if record.end is not None else record.changed(
            end=End(outcome.state, outcome.reason, None)), False
    if queue is not None and queue.state in LIVE:
        if queue.state == SlurmState.RUNNING and known is not None and record.end is None:
            return Status.RUNNING, record, True
        waiting = (f"the batch step's decision after the end on record ({record.end.state}: {record.end.reason})"
                   if record.end is not None and queue.state == SlurmState.RUNNING
                   else f"Slurm: job {queue.job_id} {queue.state} ({queue.reason or 'None'})")
        return Status.RUNNING, (previous or record).changed(phase=Phase.WAITING, end=None, waiting=waiting), False
    gone = queue.state if queue else "gone from Slurm's queue"
    state = EndState.STOPPED if gone == SlurmState.CANCELLED else EndState.FAILED
    return Status(state.value), record.changed(end=record.end or End(state, f"Slurm job {slurm_job} ended {gone} "
                                                                      "before the job ended", None)), False


def status(login_dir: str) -> dict[str, Any]:
    """The job as the follow and training-status.yml read it (trainer.runtime.host.nodestate.status's shape, as the
    hub's state: ``mode`` hub), with ``slurm`` (the queue's view and every allocation) and ``nodes`` (every member's
    state in the latest allocation). Its end is the batch step's word, or Slurm's when the job left the queue without
    one: while the job is in Slurm's hands (queued, starting, or deciding after an end on record, which a requeue may
    follow) its record says it waits, and for what."""
    login = NodePlan.read(posixpath.join(login_dir, layout.PLAN_FILE))
    submitted = read_json(posixpath.join(login_dir, SUBMITTED_FILE))
    info: dict[str, Any] = {"job_dir": login_dir, "job": login.job, "node": login.node, "mode": Mode.HUB.value}
    if not submitted:
        return {**info, "state": Status.NONE}
    slurm_job = str(submitted["slurm_job"])
    account = read_account(login_dir, slurm_job)
    queue = queue_state(slurm_job)
    allocations = account.allocations if account is not None else ()
    members = allocations[-1].members if allocations else ()
    nodes = {name: nodestate.status(posixpath.join(posixpath.dirname(login_dir), name)) for name in members}
    hub = report.freshest(nodes)
    known = report.record_of(hub) or (account.record if account is not None else None)
    launched = new_record(login, float(submitted["submitted_at"]))  # before any allocation: the launch's
    previous = account.next.previous if account is not None and account.next is not None else None
    state, record, training = judged(known, launched, previous, account.outcome if account is not None else None,
                                     queue, slurm_job)
    data = record.to_json()
    for name, node in nodes.items():
        if training and node.get("pid") and not node.get("end"):
            node["state"] = Status.RUNNING  # its supervisor is on a compute node: this host's /proc cannot see it
        elif node["state"] == Status.KILLED and record.end is not None and name not in record.lost:
            # The batch step ended the step once the end was on record: a supervisor still passing the end on was
            # stopped before it could say it was done.
            node.update(state=record.end.state.value, end=data["end"])
    watch = read_json(posixpath.join(hub.get("job_dir", ""), layout.WATCH_FILE)) if training else None
    shown = schema.dump(queue) if queue is not None else {"job_id": slurm_job, "state": GONE}
    return {**info, "state": state, "record": data, "progress": hub.get("progress"), "watch": watch,
            "end": data["end"], "nodes": nodes,
            "slurm": {**shown, "allocations": [allocation_json(a) for a in allocations]},
            "paths": hub.get("paths", {})}


def wait(login_dir: str, seconds: float, since: str) -> dict[str, Any]:
    """``status`` once its progress differs from ``since``, the job ended, or ``seconds`` passed."""
    deadline = time.monotonic() + seconds
    while True:
        current = status(login_dir)
        if (current["state"] != Status.RUNNING or report.progress_key(current) != since
                or time.monotonic() >= deadline):
            return current
        time.sleep(2.0)


def stop(login_dir: str, grace: float) -> dict[str, Any]:
    """The job's checkpoint at a common step, then scancel (see trainer.runtime.slurm.allocation); idempotent."""
    current = status(login_dir)
    if current["state"] != Status.RUNNING:
        return {"changed": False, **current}
    slurm_job = current["slurm"]["job_id"]
    if current["slurm"]["state"] == SlurmState.RUNNING:
        for name, node in current["nodes"].items():
            if isinstance(node.get("pid"), int):
                nodestate.request_stop(posixpath.join(posixpath.dirname(login_dir), name), node["pid"], "user",
                                       "stop-training.yml")
        run(["scancel", "--signal=USR1", slurm_job])  # to every step's tasks: the supervisors and their trainers
        deadline = time.monotonic() + grace + 30
        while status(login_dir)["state"] == Status.RUNNING and time.monotonic() < deadline:
            time.sleep(1.0)
    queue = queue_state(slurm_job)
    if queue is not None and queue.state in LIVE:
        run(["scancel", slurm_job])
    return {"changed": True, **status(login_dir)}

