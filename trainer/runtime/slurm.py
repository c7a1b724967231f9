"""A training job inside a Slurm allocation, and the login host's view of it (standard library only).

On a Slurm site (vidcluster_scheduler: slurm) launch-training.yml reaches only the login host. It ships the trainer
code into the shared home, has the trainer's renderer check the config, and writes into the login host's folder of
the job (``<jobs_dir>/<job>/<login host>/``, the files below) the job's description without its nodes, the
experiment config and the watch's key; then ``slurm-submit`` writes the batch script and submits it. The controller
cannot know which nodes Slurm will give: everything that depends on them is decided inside the allocation.

    slurm-batch   (the batch script, on the allocation's first node) learns the allocation (``scontrol show
                  hostnames``; a first step, one task per node, says each node's address, interface, GPUs and home),
                  has the trainer's renderer write every node's config and plan there (python -m trainer.node_config;
                  the first node is rank 0 and the hub, nodes beyond the job's world size are its spares), continues
                  the job's record from the allocation before, and runs one supervisor per node in a second step
                  (srun --kill-on-bad-exit=0 --no-kill): the job's watch forms exactly as over SSH, and heals a crashed
                  or frozen trainer, or a lost node where a spare can take its rank, inside the allocation. Once the
                  job's end is on record and no trainer runs, the step is ended (srun would wait forever for a lost
                  node's task), and the batch step decides: the end stands, or, for what the allocation cannot fix
                  (a node lost with no spare, the time limit), Slurm requeues the job (``scontrol requeue``), whose
                  next run resumes from the newest checkpoint with the same record, policy and counters.
    slurm-facts   (a task of the first step) this node's facts for the renderer, one JSON line.
    slurm-member  (a task of the second step) this node's supervisor (trainer.runtime.supervisor), its output in the
                  node's train.log, its trainer started without the task's Slurm variables (it is not a task of srun).
    slurm-submit  (login host) write the batch script and submit it with sbatch.
    slurm-status  (login host) the job as Slurm's queue and its hub's state (in the shared home) say, in the shape of
                  ``python -m trainer.runtime status``: what training-status.yml and the follow read.
    slurm-wait    (login host) the same, once its progress changed (``python -m trainer.runtime wait``).
    slurm-stop    (login host) the job's checkpoint at a step every rank agrees on (a stop request to each
                  supervisor, then SIGUSR1 to the job's steps), then scancel; a job still queued is cancelled.

The time limit: the batch script asks for SIGUSR1 some seconds before it (``--signal=B:USR1@S``, to the batch step
alone); the batch step then asks every supervisor to stop as a user's stop does, so that every rank checkpoints at the
same step, and requeues the job once the step has ended. A requeue after the time limit does not count as a restart;
one after a lost node does (``max_restarts``).

The login host's folder of a job holds (one writer each):
    plan.json, launch.json, experiment.yaml, secret   the launch (its paths; the job for the renderer; the config; key)
    job.sbatch, submitted.json                        slurm-submit (the batch script; the Slurm job id)
    slurm.json                                        the batch step (every allocation, the record to continue from,
                                                      the outcome), batch.log its output
    render/<slurm job>.<restart>/                     the renderer's output for one allocation
Every node of an allocation has its own folder beside it, as over SSH (trainer.runtime.layout), which the batch step
fills from the renderer's output. The jobs' folder must be in a home the login host and the compute nodes share.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ipaddress
import json
import os
import posixpath
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainer.runtime import layout, nodestate, report, schema
from trainer.runtime.__main__ import keep_secret
from trainer.runtime.contract import JOB_DIR_ENV
from trainer.runtime.hub import new_record
from trainer.runtime.network import interface_holding
from trainer.runtime.node import free_port
from trainer.runtime.plan import NodePlan
from trainer.runtime.record import Cause, End, EndState, JobRecord, Phase, RecordError

DESCRIPTION_FILE = "launch.json"
EXPERIMENT_FILE = "experiment.yaml"
SCRIPT_FILE = "job.sbatch"
SUBMITTED_FILE = "submitted.json"
ACCOUNT_FILE = "slurm.json"
BATCH_LOG = "batch.log"
RENDER_DIR = "render"
STEP_GRACE_S = 20.0  # after the job's end is on record, how long the members' step may take to end
# Slurm job states in which the job may still run (a requeued job passes through REQUEUED to PENDING).
LIVE = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING",
        "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT", "RESV_DEL_HOLD")


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
# The job's record across allocations


def continued(plan: NodePlan, after: dict[str, Any] | None, wall: float) -> JobRecord:
    """The record an allocation starts with: the launch's (attempt 0) for the first, else the next attempt after the
    previous allocation's record (``after``: {previous, cause, counted}, as JSON), with its attempts and restarts
    carried on and this allocation's nodes, ranks and rendezvous."""
    fresh = new_record(plan, wall)
    if after is None:
        return fresh
    previous = JobRecord.read(after["previous"], "the allocation before's record")
    attempt = previous.attempt + 1
    why = schema.parse(Cause, after["cause"], "the requeue's cause", RecordError)
    entry = dataclasses.replace(fresh.attempts[0], attempt=attempt, cause=why)
    return dataclasses.replace(fresh, attempt=attempt, attempts=(*previous.attempts, entry),
                               restarts=previous.restarts + int(after["counted"]))


def cause(node: str, kind: str, reason: str, at: float, failed_step: int | None,
          detected_at: float | None = None) -> dict[str, Any]:
    """What ended an allocation, as the next one's first attempt records it (trainer.runtime.hub's causes):
    ``detected_at`` when it was named (the hub's word, or now)."""
    named = detected_at if detected_at is not None else time.time()
    return {"node": node, "kind": kind, "reason": reason, "at": at, "rc": None, "detected_at": named,
            "detect_s": round(named - at, 1), "failed_step": failed_step}


def requeue_cause(record: dict[str, Any] | None, progress: dict[str, Any] | None, time_limit: dict[str, Any] | None,
                  batch_host: str, max_restarts: int) -> tuple[dict[str, Any], bool] | None:
    """(cause, counts as a restart) when Slurm must requeue the job after its step ended with ``record``, else None
    (the end stands): the time limit (``time_limit``: when its signal came) and a node lost with no spare, or a step
    that ended without an end on record, while restarts are left."""
    end = (record or {}).get("end")
    step = (progress or {}).get("step")
    if time_limit is not None and (end is None or end["state"] == "stopped"):
        return cause(batch_host, "preempted", time_limit["reason"], time_limit["at"], step), False
    restarts = int((record or {}).get("restarts", 0))
    if end is None:
        why = "the job's step ended without an end on record (its supervisors were killed)"
        return (cause(batch_host, "lost", why, time.time(), step), True) if restarts < max_restarts else None
    first = end.get("first_failure") or {}
    if end["state"] == "failed" and first.get("kind") == "lost" and restarts < max_restarts:
        return cause(first["node"], "lost", f"{first['reason']}; no spare in the allocation", first["at"],
                     (record or {}).get("failed_step"), (record or {}).get("detected_at")), True
    return None


# ---------------------------------------------------------------------------------------------------------------------
# Inside the allocation


def hostnames(nodelist: str) -> list[str]:
    return run(["scontrol", "show", "hostnames", nodelist]).split()


def node_address(name: str) -> str:
    """The IP address Slurm reaches a node at (its NodeAddr, resolved here)."""
    found = re.search(r"\bNodeAddr=(\S+)", run(["scontrol", "--oneliner", "show", "node", name]))
    if found is None:
        raise SlurmError(f"scontrol show node {name} gives no NodeAddr")
    try:
        return str(ipaddress.ip_address(found[1]))
    except ValueError:
        infos = socket.getaddrinfo(found[1], None, type=socket.SOCK_STREAM)
        return sorted({i[4][0] for i in infos}, key=lambda a: (ipaddress.ip_address(a).version, a))[0]


def interface_of(ip: str) -> str:
    """The interface that holds ``ip`` on this node (network.interface_holding), '' when none does."""
    return interface_holding(ip) or ""


def facts(iface: str) -> dict[str, Any]:
    """This node, as trainer.node_config's NodeFacts wants it: name, address, GPUs (the task's CUDA_VISIBLE_DEVICES,
    which Slurm sets from the job's GPUs), home, and the interface that holds the address (unless one is given)."""
    name = os.environ["SLURMD_NODENAME"]
    ip = node_address(name)
    devices = [int(d) for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip().isdigit()]
    iface = iface or interface_of(ip)
    if not iface:
        raise SlurmError(f"{name}: no interface holds {ip}, the address Slurm reaches it at (NodeAddr); set "
                         "vidcluster_network_interface to the one the trainers should use")
    return {"name": name, "ip": ip, "gpus": len(devices), "devices": devices, "home": os.path.expanduser("~"),
            "iface": iface}


class Batch:
    """The batch step of one allocation (see the module docstring)."""

    def __init__(self, login_dir: str, settings: dict[str, Any]) -> None:
        self.login_dir = login_dir
        self.login = NodePlan.read(posixpath.join(login_dir, layout.PLAN_FILE))
        self.jobs_root = posixpath.dirname(login_dir)
        self.trainers = int(settings["trainers"])
        self.iface = str(settings.get("iface", ""))
        self.slurm_job = os.environ["SLURM_JOB_ID"]
        self.restart = int(os.environ.get("SLURM_RESTART_COUNT") or 0)
        self.me = os.environ["SLURMD_NODENAME"]
        self.env = {**os.environ, "PYTHONPATH": self.login.paths.code_dir}
        account = read_json(posixpath.join(login_dir, ACCOUNT_FILE))
        self.account = account if account.get("slurm_job") == self.slurm_job else {
            "slurm_job": self.slurm_job, "allocations": [], "record": None, "next": None, "outcome": None}
        self.time_limit: dict[str, Any] | None = None
        self.cancelled = False
        self.step: subprocess.Popen[bytes] | None = None

    # -- the allocation --------------------------------------------------------------------------------------------

    def nodes(self) -> list[str]:
        """The allocation's nodes, this one (the batch host: rank 0 and the hub) first."""
        names = hostnames(os.environ["SLURM_JOB_NODELIST"])
        return [self.me, *(n for n in names if n != self.me)]

    def srun(self, names: list[str], verb: str, *args: str) -> list[str]:
        return ["srun", f"--nodes={len(names)}", f"--ntasks={len(names)}", "--ntasks-per-node=1",
                *step_cpus(os.environ), f"--nodelist={','.join(names)}", "--kill-on-bad-exit=0", "--no-kill",
                self.login.paths.env_python, *layout.RUNTIME_FLAGS, "-m", "trainer.runtime", verb, self.login_dir,
                *args]

    def node_facts(self, names: list[str]) -> list[dict[str, Any]]:
        """Every node's facts, in ``names``' order (a first step, one task per node)."""
        out = run(self.srun(names, "slurm-facts", "--iface", self.iface), env=self.env)
        found = {f["name"]: f for f in (json.loads(line) for line in out.splitlines() if line.startswith("{"))}
        missing = [name for name in names if name not in found]
        if missing:
            raise SlurmError(f"no facts came from {', '.join(missing)} (slurm-facts)")
        return [found[name] for name in names]

    def render(self, nodes: list[dict[str, Any]]) -> Path:
        """Every member's config and plan, by the trainer's renderer, into render/<job>.<restart>/."""
        description = {**read_json(posixpath.join(self.login_dir, DESCRIPTION_FILE)),
                       "port": free_port(nodes[0]["ip"]), "nodes": nodes[:self.trainers],
                       "spares": nodes[self.trainers:]}
        out_dir = Path(self.login_dir) / RENDER_DIR / f"{self.slurm_job}.{self.restart}"
        proc = subprocess.run(
            [self.login.paths.env_python, *layout.SAFE_PATH, "-m", "trainer.node_config", "--config-file",
             posixpath.join(self.login_dir, EXPERIMENT_FILE), "--job", "-", "--out-dir", str(out_dir)],
            input=json.dumps(description), capture_output=True, text=True, env=self.env, check=False)
        if proc.returncode != 0:
            raise SlurmError(f"the trainer rejects the config: {proc.stderr.strip().removeprefix('error: ')}")
        return out_dir

    def place(self, out_dir: Path, names: list[str]) -> None:
        """Each member's folder: its plan, config and the watch's key (0600), and nothing left of an allocation
        before that a member or the status could mistake for this one's."""
        secret = (Path(self.login_dir) / layout.SECRET_FILE).read_bytes()
        table = Path(self.login_dir) / layout.SITE_WEIGHTS_TABLE
        for name in names:
            folder = Path(self.jobs_root) / name
            folder.mkdir(mode=0o750, parents=True, exist_ok=True)
            for stale in (layout.STATE_FILE, layout.WATCH_FILE, layout.STOP_REQUEST_FILE):
                (folder / stale).unlink(missing_ok=True)
            (folder / layout.PLAN_FILE).write_bytes((out_dir / f"{name}.plan.json").read_bytes())
            (folder / layout.CONFIG_FILE).write_bytes((out_dir / f"{name}.yaml").read_bytes())
            keep_secret(str(folder), secret.strip())
            if table.exists():
                (folder / layout.SITE_WEIGHTS_TABLE).write_bytes(table.read_bytes())

    # -- what the members' state says ------------------------------------------------------------------------------

    def states(self, names: list[str]) -> dict[str, dict[str, Any]]:
        return {name: read_json(Path(self.jobs_root) / name / layout.STATE_FILE) for name in names}

    def on_signal(self, sig: int, _frame: object) -> None:
        if sig == signal.SIGUSR1 and self.time_limit is None:
            self.time_limit = {"at": time.time(), "reason": f"Slurm job {self.slurm_job}'s time limit is near "
                               "(SIGUSR1 from --signal): every rank checkpoints at one step, and the job requeues"}
            say(self.time_limit["reason"])
        elif sig == signal.SIGTERM:
            self.cancelled = True
            say("SIGTERM: the job is being cancelled or requeued by Slurm")

    def stop_members(self, names: list[str]) -> None:
        """The time limit: every supervisor's trainer checkpoints at a common step and stops (as a user's stop)."""
        for name, state in self.states(names).items():
            if isinstance(state.get("pid"), int):
                nodestate.request_stop(str(Path(self.jobs_root) / name), state["pid"], "slurm",
                                       (self.time_limit or {}).get("reason", "the time limit"))
        if self.step is not None and self.step.poll() is None:
            self.step.send_signal(signal.SIGUSR1)  # srun passes it on to every task: the supervisors

    def watch(self, names: list[str]) -> dict[str, dict[str, Any]]:
        """Wait for the members' step. Once the job's end is on record and no member's trainer runs any more, the
        step has nothing left to do: it is ended 2 s later (the supervisors linger to pass the end on; srun waits
        forever for the task of a lost node), STEP_GRACE_S after the end at most."""
        assert self.step is not None
        stopped_for_limit, ended = False, None
        while self.step.poll() is None:
            if self.time_limit is not None and not stopped_for_limit:
                self.stop_members(names)
                stopped_for_limit = True
            states = self.states(names)
            record = report.freshest(states).get("record") or {}
            if record.get("end"):
                ended = ended or time.monotonic()
                idle = not any((state.get("trainer") or {}).get("state") == "running" for state in states.values())
                if (idle and time.monotonic() - ended > 2.0) or time.monotonic() - ended > STEP_GRACE_S:
                    self.end_step(record)
                    break
            time.sleep(1.0)
        return self.states(names)

    def end_step(self, record: dict[str, Any]) -> None:
        assert self.step is not None
        lost = ", ".join(record.get("lost", {})) or "none"
        say(f"the job's end is on record, no trainer runs, and its step still does (lost nodes: {lost}): ending it")
        self.step.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.step.wait(15)
        self.step.kill()

    # -- the decision ----------------------------------------------------------------------------------------------

    def write_account(self) -> None:
        nodestate.write_json(posixpath.join(self.login_dir, ACCOUNT_FILE), self.account)

    def end(self, state: str, reason: str, status: int) -> int:
        say(f"the job {state}: {reason}")
        self.account["outcome"] = {"state": state, "reason": reason, "at": time.time()}
        self.account["allocations"][-1]["ended"] = {"at": time.time(), "action": state, "why": reason}
        self.write_account()
        return status

    def requeue(self, why: dict[str, Any], counted: bool, record: dict[str, Any] | None) -> int:
        self.account["next"] = {"previous": record, "cause": why, "counted": counted}
        self.account["allocations"][-1]["ended"] = {"at": time.time(), "action": "requeue", "why": why["reason"]}
        self.write_account()
        say(f"requeueing Slurm job {self.slurm_job}: {why['reason']}")
        try:
            run(["scontrol", "requeue", self.slurm_job])
        except SlurmError as exc:
            return self.end("failed", f"{why['reason']}; and Slurm would not requeue the job ({exc})", 1)
        deadline = time.monotonic() + 600
        while not self.cancelled and time.monotonic() < deadline:  # Slurm ends this batch step now
            time.sleep(1.0)
        return 0

    def previous_allocation_lost(self) -> None:
        """An allocation that ended without a word from its batch step lost its batch host (Slurm requeued the job):
        the next attempt continues from the freshest record its members kept."""
        last = self.account["allocations"][-1] if self.account["allocations"] else None
        if last is None or "ended" in last:
            return
        states = self.states(last["members"])
        best = report.freshest(states)
        step = (best.get("progress") or {}).get("step")
        why = cause(last["batch_host"], "lost", f"the allocation's first node ({last['batch_host']}, which ran the "
                    "batch step and the hub) was lost", last["started_at"], step)
        last["ended"] = {"at": time.time(), "action": "requeue", "why": why["reason"]}
        self.account["next"] = {"previous": best.get("record") or self.account.get("record"), "cause": why,
                                "counted": True}

    def run(self) -> int:
        for sig in (signal.SIGUSR1, signal.SIGTERM):
            signal.signal(sig, self.on_signal)
        self.previous_allocation_lost()
        names = self.nodes()
        say(f"Slurm job {self.slurm_job} (run {self.restart + 1}) on {', '.join(names)}: {self.trainers} train, "
            f"{len(names) - self.trainers} spare")
        self.account["outcome"] = None
        self.account["allocations"].append({"restart": self.restart, "batch_host": self.me, "members": names,
                                            "started_at": time.time()})
        self.write_account()
        if len(names) < self.trainers:
            return self.end("failed", f"the allocation has {len(names)} nodes, the job trains on {self.trainers}", 1)
        try:
            out_dir = self.render(self.node_facts(names))
        except SlurmError as exc:
            return self.end("failed", str(exc), 1)
        self.place(out_dir, names)
        plan = NodePlan.read(str(out_dir / f"{names[0]}.plan.json"))
        record = continued(plan, self.account.get("next"), time.time()).to_json()
        self.account.update(record=record, next=None)
        self.write_account()
        if self.time_limit is not None:  # it came before the trainers could start: nothing to checkpoint
            return self.requeue(cause(self.me, "preempted", self.time_limit["reason"], self.time_limit["at"], None),
                                False, record)
        say(f"attempt {record['attempt']}: starting every node's supervisor")
        self.step = subprocess.Popen(self.srun(names, "slurm-member"), env=self.env)
        states = self.watch(names)
        best = report.freshest(states)
        final = best.get("record") or record
        if self.cancelled and self.time_limit is None:
            return self.end("stopped", f"Slurm job {self.slurm_job} was cancelled", 0)
        requeue = requeue_cause(final, best.get("progress"), self.time_limit, self.me, plan.restarts.max_restarts)
        if requeue is not None:
            return self.requeue(*requeue, final)
        end = final.get("end") or {"state": "failed", "reason": "the job's step ended without an end on record"}
        return self.end(end["state"], end["reason"], 0 if end["state"] != "failed" else 1)


def step_cpus(environ: Mapping[str, str]) -> list[str]:
    """The CPUs of a step's one task per node: the job's --cpus-per-task, said again (srun 22.05 to 23.02 does not
    read it from the job, and its task would be bound to one CPU). Whole nodes (--exclusive) need nothing: a step
    gets all of the job's CPUs on each node."""
    cpus = environ.get("SLURM_CPUS_PER_TASK", "")
    return [f"--cpus-per-task={cpus}"] if cpus else []


def batch(login_dir: str, settings: dict[str, Any]) -> int:
    """The batch script's body (see the module docstring)."""
    try:
        return Batch(login_dir, settings).run()
    except (SlurmError, OSError, ValueError) as exc:
        say(f"the batch step failed: {exc}")
        return 1


def member(login_dir: str) -> int:
    """This node's supervisor, as a task of the members' step (see the module docstring)."""
    from trainer.runtime.supervisor import Supervisor

    name = os.environ["SLURMD_NODENAME"]
    job_dir = posixpath.join(posixpath.dirname(login_dir), name)
    for variable in [v for v in os.environ if v.startswith(("SLURM_", "SLURMD_"))]:
        del os.environ[variable]  # the trainer is not a task of srun (trainer.distributed would take it for one)
    os.environ[JOB_DIR_ENV] = job_dir
    log = os.open(posixpath.join(job_dir, layout.LOG_FILE), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
    for fd in (1, 2):
        os.dup2(log, fd)
    plan = NodePlan.read(posixpath.join(job_dir, layout.PLAN_FILE))
    hub = plan.members[0].name
    hub_addr = None if hub == name else wait_for_hub(posixpath.join(posixpath.dirname(login_dir), hub),
                                                      plan.watch.startup_timeout)
    supervisor = Supervisor(job_dir, hub_addr)
    # This allocation's record (the launch's, or the next attempt after the allocation before), not a new one.
    supervisor.record = JobRecord.read(read_json(posixpath.join(login_dir, ACCOUNT_FILE))["record"])
    return asyncio.run(supervisor.run())


def wait_for_hub(hub_dir: str, timeout: float) -> str:
    """Where the hub's supervisor listens, once its state.json says (the batch step removed the last allocation's)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        addr = read_json(posixpath.join(hub_dir, layout.STATE_FILE)).get("addr")
        if addr:
            return str(addr)
        time.sleep(0.2)
    raise SlurmError(f"the hub's supervisor ({hub_dir}) did not start within {timeout:.0f} s")


# ---------------------------------------------------------------------------------------------------------------------
# On the login host


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
    settings = {"trainers": int(options["trainers"]), "iface": str(options.get("iface", ""))}
    return "\n".join([
        f"#!{login.paths.env_python} -{''.join(flag.lstrip('-') for flag in layout.RUNTIME_FLAGS)}",
        *(f"#SBATCH {option}" for option in asked),
        f'"""VidCluster job {login.job}: its batch step (trainer.runtime.slurm). Written by slurm-submit."""',
        "import sys",
        f"sys.path.insert(0, {json.dumps(login.paths.code_dir)})",
        "from trainer.runtime import slurm  # noqa: E402",
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


def queue_state(slurm_job: str) -> dict[str, Any] | None:
    """The Slurm job as scontrol shows it (state, reason, nodes, run time, time limit, restarts), None when Slurm no
    longer knows it."""
    try:
        shown = run(["scontrol", "--oneliner", "show", "job", slurm_job])
    except SlurmError:
        return None
    fields = dict(re.findall(r"(\w+)=(\S*)", shown))
    return {"job_id": slurm_job, "state": fields.get("JobState", "UNKNOWN"), "reason": fields.get("Reason", ""),
            "nodes": fields.get("NodeList", ""), "run_time": fields.get("RunTime", ""),
            "time_limit": fields.get("TimeLimit", ""), "restarts": int(fields.get("Restarts", "0") or 0)}


def judged(known: JobRecord | None, launched: JobRecord, previous: JobRecord | None,
           outcome: dict[str, Any] | None, queue: dict[str, Any] | None, slurm_job: str) -> tuple[str, JobRecord, bool]:
    """(the job's state, the record its status shows, whether its trainers run now), from the freshest record the
    members or the batch step hold (``known``; else the launch's), the batch step's ``outcome``, and Slurm's
    ``queue`` (queue_state's; None: Slurm no longer knows the job). While the job is in Slurm's hands its record
    (``previous``: the one a requeue continues, else the known one) waits, and says for what."""
    record = known or launched
    if outcome:
        state = outcome["state"]
        return state, record if record.end is not None else record.changed(
            end=End(EndState(state), outcome["reason"], None)), False
    if queue is not None and queue["state"] in LIVE:
        training = queue["state"] == "RUNNING" and known is not None and record.end is None
        if training:
            return "running", record, True
        waiting = (f"the batch step's decision after the end on record ({record.end.state}: {record.end.reason})"
                   if record.end is not None and queue["state"] == "RUNNING"
                   else f"Slurm: job {queue['job_id']} {queue['state']} ({queue['reason'] or 'None'})")
        return "running", (previous or record).changed(phase=Phase.WAITING, end=None, waiting=waiting), False
    gone = queue["state"] if queue else "gone from Slurm's queue"
    state = "stopped" if gone == "CANCELLED" else "failed"
    return state, record.changed(end=record.end or End(EndState(state), f"Slurm job {slurm_job} ended {gone} "
                                                       "before the job ended", None)), False


def status(login_dir: str) -> dict[str, Any]:
    """The job as the follow and training-status.yml read it (trainer.runtime.nodestate.status's shape, as the hub's
    state: ``mode`` hub), with ``slurm`` (the queue's view and every allocation) and ``nodes`` (every member's state
    in the latest allocation). Its end is the batch step's word, or Slurm's when the job left the queue without one:
    while the job is in Slurm's hands (queued, starting, or deciding after an end on record, which a requeue may
    follow) its record says it waits, and for what."""
    login = NodePlan.read(posixpath.join(login_dir, layout.PLAN_FILE))
    submitted = read_json(posixpath.join(login_dir, SUBMITTED_FILE))
    info: dict[str, Any] = {"job_dir": login_dir, "job": login.job, "node": login.node, "mode": "hub"}
    if not submitted:
        return {**info, "state": "none"}
    account = read_json(posixpath.join(login_dir, ACCOUNT_FILE))
    if account.get("slurm_job") != submitted["slurm_job"]:
        account = {}
    queue = queue_state(submitted["slurm_job"])
    allocations = account.get("allocations") or []
    members = allocations[-1]["members"] if allocations else []
    nodes = {name: nodestate.status(posixpath.join(posixpath.dirname(login_dir), name)) for name in members}
    hub = report.freshest(nodes)
    known = report.record_of(hub) or report.record_of({"record": account.get("record")})
    launched = new_record(login, float(submitted["submitted_at"]))  # before any allocation: the launch's
    previous = report.record_of({"record": (account.get("next") or {}).get("previous")})
    state, record, training = judged(known, launched, previous, account.get("outcome"), queue,
                                     submitted["slurm_job"])
    data = record.to_json()
    for name, node in nodes.items():
        if training and node.get("pid") and not node.get("end"):
            node["state"] = "running"  # its supervisor is on a compute node: this host's /proc cannot see it
        elif node["state"] == "killed" and record.end is not None and name not in record.lost:
            # The batch step ended the step once the end was on record: a supervisor still passing the end on was
            # stopped before it could say it was done.
            node.update(state=record.end.state.value, end=data["end"])
    watch = read_json(posixpath.join(hub.get("job_dir", ""), layout.WATCH_FILE)) if training else None
    return {**info, "state": state, "record": data, "progress": hub.get("progress"), "watch": watch,
            "end": data["end"], "nodes": nodes,
            "slurm": {**(queue or {"job_id": submitted["slurm_job"], "state": "gone"}), "allocations": allocations},
            "paths": hub.get("paths", {})}


def wait(login_dir: str, seconds: float, since: str) -> dict[str, Any]:
    """``status`` once its progress differs from ``since``, the job ended, or ``seconds`` passed."""
    deadline = time.monotonic() + seconds
    while True:
        current = status(login_dir)
        if current["state"] != "running" or report.progress_key(current) != since or time.monotonic() >= deadline:
            return current
        time.sleep(2.0)


def stop(login_dir: str, grace: float) -> dict[str, Any]:
    """The job's checkpoint at a common step, then scancel (see the module docstring); idempotent."""
    current = status(login_dir)
    if current["state"] != "running":
        return {"changed": False, **current}
    slurm_job = current["slurm"]["job_id"]
    if current["slurm"]["state"] == "RUNNING":
        for name, node in current["nodes"].items():
            if isinstance(node.get("pid"), int):
                nodestate.request_stop(posixpath.join(posixpath.dirname(login_dir), name), node["pid"], "user",
                                       "stop-training.yml")
        run(["scancel", "--signal=USR1", slurm_job])  # to every step's tasks: the supervisors and their trainers
        deadline = time.monotonic() + grace + 30
        while status(login_dir)["state"] == "running" and time.monotonic() < deadline:
            time.sleep(1.0)
    if (queue_state(slurm_job) or {}).get("state") in LIVE:
        run(["scancel", slurm_job])
    return {"changed": True, **status(login_dir)}


# ---------------------------------------------------------------------------------------------------------------------
# The verbs


def main(argv: list[str]) -> int:
    """``python -m trainer.runtime slurm-VERB LOGIN_DIR [ARGS]`` (trainer.runtime.__main__ passes them here). The
    verbs inside the allocation print their own lines; the login host's print one JSON object, or one error line."""
    verb, login_dir, rest = argv[0], os.path.realpath(os.path.expanduser(argv[1])), argv[2:]
    if verb == "slurm-batch":
        return batch(login_dir, json.loads(rest[0]))
    if verb == "slurm-member":
        return member(login_dir)
    try:
        if verb == "slurm-facts":
            result = facts(rest[rest.index("--iface") + 1])
        elif verb == "slurm-submit":
            result = submit(login_dir, json.loads(rest[0]))
        elif verb == "slurm-status":
            result = status(login_dir)
        elif verb == "slurm-wait":
            result = wait(login_dir, float(rest[0]), rest[rest.index("--since") + 1] if "--since" in rest else "")
        elif verb == "slurm-stop":
            plan = read_json(posixpath.join(login_dir, layout.PLAN_FILE))
            result = stop(login_dir, float((plan.get("watch") or {}).get("stop_grace", 15)))
        else:
            raise SlurmError(f"unknown verb {verb}")
    except SlurmError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result))
    return 0
