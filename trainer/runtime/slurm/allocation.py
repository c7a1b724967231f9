"""A training job inside a Slurm allocation, and the slurm-VERBs (standard library only).

On a Slurm site (vidcluster_scheduler: slurm) launch-training.yml reaches only the login host. It ships the trainer
code into the shared home, has the trainer's renderer check the config, and writes into the login host's folder of
the job (``<jobs_dir>/<job>/<login host>/``: trainer.runtime.slurm.account lists its files) the job's description
without its nodes, the experiment config and the watch's key; then ``slurm-submit`` writes the batch script and submits
it. The controller cannot know which nodes Slurm will give: everything that depends on them is decided inside the
allocation.

    slurm-batch   (the batch script, on the allocation's first node) learns the allocation (``scontrol show
                  hostnames``; a first step, one task per node, says each node's address, interface, GPUs and home),
                  has the trainer's renderer write every node's config and plan there (python -m trainer.node_config;
                  the first node is rank 0 and the hub, nodes beyond the job's world size are its spares), continues
                  the job's record from the allocation before, and runs one supervisor per node in a second step
                  (srun --kill-on-bad-exit=0 --no-kill): the job's watch forms exactly as over SSH, and heals a crashed
                  or frozen trainer, or a lost node where a spare can take its rank or where the nodes left are
                  vidcluster_min_nodes at least (the world shrinks: trainer.runtime.job.policy), inside the
                  allocation. Once the job's end is on record and no trainer runs, the step is ended (srun would wait
                  forever for a lost node's task), and the batch step decides: the end stands, or, for what the
                  allocation cannot fix (a node lost with no spare and too few left, the time limit), Slurm requeues
                  the job (``scontrol requeue``), whose next run resumes from the newest checkpoint with the same
                  record, policy and counters.
    slurm-facts   (a task of the first step) this node's facts for the renderer, one JSON line.
    slurm-member  (a task of the second step) this node's supervisor (trainer.runtime.watch.supervisor), its output in
    the
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

The batch step's decision once the members' step ended: trainer.runtime.job.requeue; its account of the job:
trainer.runtime.slurm.account; the login host's verbs: trainer.runtime.slurm.login.
"""

from __future__ import annotations

import asyncio
import contextlib
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

from trainer.runtime import layout, report
from trainer.runtime.contract import JOB_DIR_ENV
from trainer.runtime.host import nodestate
from trainer.runtime.host.network import interface_holding
from trainer.runtime.host.ports import free_port
from trainer.runtime.job import requeue
from trainer.runtime.job.record import End, EndState, JobRecord
from trainer.runtime.job.requeue import Requeue, TimeLimit
from trainer.runtime.plan import NodePlan
from trainer.runtime.slurm import login as slurmlogin
from trainer.runtime.slurm.account import (
    ACCOUNT_FILE,
    DESCRIPTION_FILE,
    EXPERIMENT_FILE,
    RENDER_DIR,
    Account,
    Allocation,
    SlurmError,
    continued,
    fresh_account,
    read_account,
    read_json,
    run,
    say,
    write_account,
)
from trainer.runtime.watch.messages import TrainerState

STEP_GRACE_S = 20.0  # after the job's end is on record, how long the members' step may take to end


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
        self.min_nodes: int | None = settings.get("min_nodes")  # vidcluster_min_nodes (None: every trainer)
        self.iface = str(settings.get("iface", ""))
        self.slurm_job = os.environ["SLURM_JOB_ID"]
        self.restart = int(os.environ.get("SLURM_RESTART_COUNT") or 0)
        self.me = os.environ["SLURMD_NODENAME"]
        self.env = {**os.environ, "PYTHONPATH": self.login.paths.code_dir}
        self.account: Account = read_account(login_dir, self.slurm_job) or fresh_account(self.slurm_job)
        self.time_limit: TimeLimit | None = None
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

    def description(self, nodes: list[dict[str, Any]]) -> dict[str, Any]:
        """The job's description for the renderer with the allocation's nodes (the login host's had itself alone)."""
        described = read_json(posixpath.join(self.login_dir, DESCRIPTION_FILE))
        return {**described, "port": free_port(nodes[0]["ip"]), "nodes": nodes[:self.trainers],
                "spares": nodes[self.trainers:],
                "restarts": {**described.get("restarts", {}), "min_nodes": self.min_nodes}}

    def render(self, nodes: list[dict[str, Any]]) -> Path:
        """Every member's config and plan, by the trainer's renderer, into render/<job>.<restart>/."""
        description = self.description(nodes)
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
            nodestate.keep_secret(str(folder), secret.strip())
            if table.exists():
                (folder / layout.SITE_WEIGHTS_TABLE).write_bytes(table.read_bytes())

    # -- what the members' state says ------------------------------------------------------------------------------

    def states(self, names: tuple[str, ...] | list[str]) -> dict[str, dict[str, Any]]:
        return {name: read_json(Path(self.jobs_root) / name / layout.STATE_FILE) for name in names}

    def on_signal(self, sig: int, _frame: object) -> None:
        if sig == signal.SIGUSR1 and self.time_limit is None:
            self.time_limit = TimeLimit(time.time(), f"Slurm job {self.slurm_job}'s time limit is near (SIGUSR1 "
                                        "from --signal): every rank checkpoints at one step, and the job requeues")
            say(self.time_limit.reason)
        elif sig == signal.SIGTERM:
            self.cancelled = True
            say("SIGTERM: the job is being cancelled or requeued by Slurm")

    def stop_members(self, names: list[str]) -> None:
        """The time limit: every supervisor's trainer checkpoints at a common step and stops (as a user's stop)."""
        why = self.time_limit.reason if self.time_limit is not None else "the time limit"
        for name, state in self.states(names).items():
            if isinstance(state.get("pid"), int):
                nodestate.request_stop(str(Path(self.jobs_root) / name), state["pid"], "slurm", why)
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
            record = report.record_of(report.freshest(states))
            if record is not None and record.ended:
                ended = ended or time.monotonic()
                idle = not any((state.get("trainer") or {}).get("state") == TrainerState.RUNNING
                               for state in states.values())
                if (idle and time.monotonic() - ended > 2.0) or time.monotonic() - ended > STEP_GRACE_S:
                    self.end_step(record)
                    break
            time.sleep(1.0)
        return self.states(names)

    def end_step(self, record: JobRecord) -> None:
        assert self.step is not None
        lost = ", ".join(record.lost) or "none"
        say(f"the job's end is on record, no trainer runs, and its step still does (lost nodes: {lost}): ending it")
        self.step.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.step.wait(15)
        self.step.kill()

    # -- the decision ----------------------------------------------------------------------------------------------

    def keep(self, account: Account) -> None:
        self.account = account
        write_account(self.login_dir, account)

    def end(self, state: EndState, reason: str) -> int:
        """The job's end stands: the batch step's exit status (1 when it failed)."""
        say(f"the job {state}: {reason}")
        self.keep(self.account.ended(state, reason, time.time()))
        return 1 if state == EndState.FAILED else 0

    def requeue(self, decided: Requeue, record: JobRecord | None) -> int:
        why = decided.cause.reason
        self.keep(self.account.requeued(decided, record, time.time()))
        say(f"requeueing Slurm job {self.slurm_job}: {why}")
        try:
            run(["scontrol", "requeue", self.slurm_job])
        except SlurmError as exc:
            return self.end(EndState.FAILED, f"{why}; and Slurm would not requeue the job ({exc})")
        deadline = time.monotonic() + 600
        while not self.cancelled and time.monotonic() < deadline:  # Slurm ends this batch step now
            time.sleep(1.0)
        return 0

    def carry_out(self, decided: Requeue | End, record: JobRecord) -> int:
        if isinstance(decided, Requeue):
            return self.requeue(decided, record)
        return self.end(decided.state, decided.reason)

    def previous_allocation_lost(self) -> None:
        """An allocation that ended without a word from its batch step lost its batch host (Slurm requeued the job):
        the next attempt continues from the freshest record its members kept."""
        last = self.account.allocations[-1] if self.account.allocations else None
        if last is None or last.ended is not None:
            return
        best = report.freshest(self.states(last.members))
        lost = requeue.host_lost(last.batch_host, last.started_at, (best.get("progress") or {}).get("step"),
                                 time.time())
        self.account = self.account.requeued(lost, report.record_of(best) or self.account.record, time.time())

    def decide(self, record: JobRecord, step: int | None, max_restarts: int) -> Requeue | End:
        return requeue.decide(record=record, step=step, time_limit=self.time_limit, cancelled=self.cancelled,
                              batch_host=self.me, slurm_job=self.slurm_job, max_restarts=max_restarts,
                              now=time.time())

    def run(self) -> int:
        for sig in (signal.SIGUSR1, signal.SIGTERM):
            signal.signal(sig, self.on_signal)
        self.previous_allocation_lost()
        names = self.nodes()
        say(f"Slurm job {self.slurm_job} (run {self.restart + 1}) on {', '.join(names)}: {self.trainers} train, "
            f"{len(names) - self.trainers} spare")
        self.keep(self.account.started(Allocation(self.restart, self.me, tuple(names), time.time(), None)))
        if len(names) < self.trainers:
            return self.end(EndState.FAILED, f"the allocation has {len(names)} nodes, the job trains on "
                            f"{self.trainers}")
        try:
            out_dir = self.render(self.node_facts(names))
        except SlurmError as exc:
            return self.end(EndState.FAILED, str(exc))
        self.place(out_dir, names)
        plan = NodePlan.read(str(out_dir / f"{names[0]}.plan.json"))
        record = continued(plan, self.account.next, time.time())
        self.keep(self.account.continuing(record))
        if self.time_limit is not None:  # it came before the trainers could start: nothing to checkpoint
            return self.carry_out(self.decide(record, None, plan.restarts.max_restarts), record)
        say(f"attempt {record.attempt}: starting every node's supervisor")
        self.step = subprocess.Popen(self.srun(names, "slurm-member"), env=self.env)
        best = report.freshest(self.watch(names))
        final = report.record_of(best) or record
        step = (best.get("progress") or {}).get("step")
        return self.carry_out(self.decide(final, step, plan.restarts.max_restarts), final)


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
    from trainer.runtime.watch.supervisor import Supervisor

    name = os.environ["SLURMD_NODENAME"]
    job_dir = posixpath.join(posixpath.dirname(login_dir), name)
    # This allocation's record (the launch's, or the next attempt after the allocation before), not a new one.
    account = read_account(login_dir, os.environ["SLURM_JOB_ID"])
    if account is None or account.record is None:
        raise SlurmError(f"{posixpath.join(login_dir, ACCOUNT_FILE)} holds no record for this allocation")
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
    supervisor.record = account.record
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
# The verbs


def main(argv: list[str]) -> int:
    """``python -m trainer.runtime slurm-VERB LOGIN_DIR [ARGS]`` (trainer.runtime.__main__ passes them here). The
    verbs inside the allocation print their own lines; the login host's (trainer.runtime.slurm.login) print one JSON
    object, or one error line."""
    verb, login_dir, rest = argv[0], os.path.realpath(os.path.expanduser(argv[1])), argv[2:]
    if verb == "slurm-batch":
        return batch(login_dir, json.loads(rest[0]))
    if verb == "slurm-member":
        return member(login_dir)
    try:
        if verb == "slurm-facts":
            result = facts(rest[rest.index("--iface") + 1])
        elif verb == "slurm-submit":
            result = slurmlogin.submit(login_dir, json.loads(rest[0]))
        elif verb == "slurm-status":
            result = slurmlogin.status(login_dir)
        elif verb == "slurm-wait":
            since = rest[rest.index("--since") + 1] if "--since" in rest else ""
            result = slurmlogin.wait(login_dir, float(rest[0]), since)
        elif verb == "slurm-stop":
            grace = NodePlan.read(posixpath.join(login_dir, layout.PLAN_FILE)).watch.stop_grace
            result = slurmlogin.stop(login_dir, grace)
        else:
            raise SlurmError(f"unknown verb {verb}")
    except SlurmError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result))
    return 0
