"""The watch at fleet size: one real hub and 64, 256, 1,024 members on loopback addresses.

    .venv/bin/python -m bench.watch_scale [--sizes 64 256 1024] [--heartbeat S] [--before]

The hub is a real supervisor (``python -m trainer.runtime start``: its listener, the wire's MACs, the schema's check
of every message, its own stand-in trainer, tests/runtime/standin.py) at 127.1.0.1. The members are stand-ins in this
process, each a real ``trainer.runtime.watch.member.Member`` (the runtime's own code dials, reports and reads the
answers) bound to its own loopback address (127.1.X.Y: the listener admits members by address, at most 8 connections
each); what a stand-in lacks is a trainer process and a listener of its own: it says its trainer runs the attempt the
record gives it, stops it when the record says stopping, and reports at the runtime's intervals
(trainer.runtime.job.timing).

Measured per size: bytes per report period both ways (the kernel's counts of the hub's sockets, ``ss -ti``), the
hub process's CPU seconds per wall second, the time from a killed trainer (a stand-in reports its trainer died of
SIGKILL) to the hub naming it, the time from a member's last report (it goes silent: its following stops, as a hung
node's does) to the hub naming it lost, and the time from the hub's start of the next attempt until every member holds
it. ``--before``: the stand-ins say they hold no record (version 0), so every report is answered with the whole
record, as every report was before the hub answered ``unchanged`` (trainer.runtime.watch.messages).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from trainer.node_config import JobSpec, render_job
from trainer.runtime import layout
from trainer.runtime.host import nodestate, procs
from trainer.runtime.job.hub import new_record
from trainer.runtime.job.record import JobRecord, NodeTimeline, Phase, Start, with_changes
from trainer.runtime.plan import Member as Planned
from trainer.runtime.plan import NodePlan
from trainer.runtime.watch import wire
from trainer.runtime.watch.member import Member, until_next_report
from trainer.runtime.watch.messages import IDLE, RecordReply, Report, Says, Trainer, TrainerState, joined_with

REPO = Path(__file__).resolve().parents[1]
STANDIN = REPO / "tests" / "runtime" / "standin.py"
SIZES = (64, 256, 1024)
BEFORE_SIZES = (64, 256)  # with the record on every report, 1,024 stand-ins cannot keep up in one process
DETECT_MARGIN_S = 5.0  # the goal: a failure named within the heartbeat timeout and this
HEARTBEAT_S = 12.0  # a report every 2 s: five times the default's rate (60 s), so five times the hub's load
# 1,024 stand-ins in one process fall behind a 2 s report on a loaded 2-core machine: they run at the default
LARGE, LARGE_HEARTBEAT_S = 1024, 60.0
SECRET = b"the-watch-bench-secret-of-this-run"
EXPERIMENT = {"CONFIG": {
    "DATA": {"TRAIN_ANNO_PATH": "~/data/k/train.txt", "TRAIN_DATA_PATH": "~/data/k",
             "VAL_ANNO_PATH": "~/data/k/val.txt", "VAL_DATA_PATH": "~/data/k", "NUM_CLASSES": 2},
    "MODEL": {"NAME": "i3d_tiny"},
    "LOG": {"BASE_PATH": "~/scratch/exps", "EXP_NAME": "use_time", "LOG_FILENAME": "train-log.txt",
            "SAVE_DIR": "ckpts"},
}}


def address(index: int) -> str:
    """Member ``index``'s loopback address (0: the hub): 127.1.0.1, 127.1.0.2, ... 127.1.0.250, 127.1.1.1, ..."""
    return f"127.1.{index // 250}.{index % 250 + 1}"


def hub_plan(folder: Path, members: int, heartbeat: float) -> NodePlan:
    """The hub's plan: a job of ``members`` trainers, rendered by the trainer's renderer for its first two and widened
    to all (each member's plan differs only in ``node``)."""
    nodes = [{"name": f"n{i}", "ip": address(i), "gpus": 0, "home": str(folder / f"home{i}"), "iface": "lo"}
             for i in range(2)]
    spec = JobSpec.from_json({
        "job_id": "watch-bench", "port": 29500, "code_version": "bench", "nodes": nodes, "spares": [],
        "watch": {"heartbeat_timeout": heartbeat, "stop_grace": 2.0, "startup_timeout": 300.0},
        "restarts": {"max_restarts": 5, "node_wait": 600.0, "in_place": True}})
    rendered = render_job(EXPERIMENT, spec, "bench.yaml")["members"]["n0"]["plan"]
    run = rendered.paths.run_dir
    peers = folder / "peers"
    peers.mkdir(parents=True, exist_ok=True)
    return dataclasses.replace(
        rendered, members=tuple(Planned(f"n{i}", address(i), i) for i in range(members)),
        argv=(sys.executable, *layout.SAFE_PATH, str(STANDIN), "--config-file", "x"),
        env={**rendered.env, "PYTHONPATH": str(REPO), "STANDIN_RUN_DIR": run, "STANDIN_STEPS": "1000000",
             "STANDIN_PEERS": str(peers)})


class StandIn:
    """A member without a trainer process (trainer.runtime.watch.member.Local): its trainer runs whichever attempt the
    record assigns it, stops when the record says stopping, and can be killed or the member silenced."""

    def __init__(self, plan: NodePlan, keyring: wire.Keyring, index: int, claims_nothing: bool) -> None:
        self.plan, self.node = plan, plan.node
        self.timings = plan.timings
        self.addr = f"{plan.me.ip}:{40000 + index}"  # where its supervisor would listen (it goes in the directory)
        self.claims_nothing = claims_nothing  # --before: report version 0, so every answer carries the record
        self.record: JobRecord = new_record(plan, time.time())
        self.term = 0
        self.heard_hub = time.monotonic()
        self.trainer: Trainer = IDLE
        self.timeline: NodeTimeline | None = None
        self.news = asyncio.Event()
        self.learned: dict[int, float] = {}  # attempt -> wall time this member first held it
        self.reports = 0
        self.answers: Counter[Says] = Counter()
        self.last_report = 0.0  # wall time
        self.member = Member(plan, keyring, self, lambda line: print(f"{self.node}: {line}", file=sys.stderr))
        self.reconcile()

    # -- trainer.runtime.watch.member.Local ----------------------------------------------------------------------------

    def report(self, says: Says, term: int | None = None) -> Report:
        self.reports += 1
        self.last_report = time.time()
        return Report(says=says, node=self.node, term=self.term if term is None else term, addr=self.addr,
                      version=0 if self.claims_nothing else self.record.version, trainer=self.trainer, trouble=None,
                      progress=None, port_offer=None, record=joined_with(says, self.record), pace=None,
                      timeline=self.timeline)

    def adopt(self, reply: RecordReply) -> bool:
        """As a node's supervisor adopts the hub's answer (trainer.runtime.watch.supervisor), counting its kinds."""
        self.answers[reply.says] += 1
        record = reply.record or with_changes(self.record, reply.changes)
        if record is not None and record.newer_than(self.record):
            self.record, self.term = record, max(self.term, record.term)
        self.heard_hub = time.monotonic()
        self.reconcile()
        return self.record.end is not None

    def directory(self) -> dict[str, str]:
        return dict(self.record.directory)

    def is_done(self) -> bool:
        return self.record.end is not None

    def is_hub(self) -> bool:
        return False

    async def until_next_report(self) -> None:
        await until_next_report(self.news, self.timings,
                                waiting=not self.trainer.running and self.trainer.attempt is not None)

    async def follow(self, hub_addr: str) -> None:
        """Follow the hub until the job ends (a supervisor would look for another hub after the loss time; here
        the hub is never lost, and a member slow to join because this process is busy tries again)."""
        while not self.is_done():
            self.heard_hub = time.monotonic()
            await self.member.follow(hub_addr)

    # -- its trainer -----------------------------------------------------------------------------------------------

    def reconcile(self) -> None:
        """Run the record's attempt, or stop it, as a node's supervisor does (trainer.runtime.host.node)."""
        record, now = self.record, time.time()
        rank = record.assignment.get(self.node)
        if record.attempt not in self.learned:
            self.learned[record.attempt] = now
        if record.phase == Phase.RUNNING and rank is not None and self.trainer.attempt != record.attempt:
            self.trainer = Trainer(attempt=record.attempt, state=TrainerState.RUNNING, rank=rank, pid=None, rc=None,
                                   started=now, ended=None)
            self.timeline = NodeTimeline(start=Start.IN_PLACE, fallback="", started=now, imported=now, group=now,
                                         checkpoint=None, first_step=now)
            self.news.set()
        elif record.phase == Phase.STOPPING and self.trainer.running and self.trainer.attempt == record.attempt:
            self.stop(-signal.SIGTERM)

    def stop(self, rc: int) -> None:
        self.trainer = dataclasses.replace(self.trainer, state=TrainerState.EXITED, rc=rc, ended=time.time())
        self.news.set()


@dataclass(frozen=True)
class Traffic:
    """The hub's sockets' byte counts (the kernel's), its CPU seconds, the stand-ins' reports, at one moment."""

    wall: float
    to_members: int
    from_members: int
    hub_cpu: float
    reports: int
    unchanged: int

    def per_period(self, later: Traffic, period: float) -> dict[str, float]:
        span = later.wall - self.wall
        scale = period / span
        return {"to_members_B": (later.to_members - self.to_members) * scale,
                "from_members_B": (later.from_members - self.from_members) * scale,
                "reports": (later.reports - self.reports) * scale,
                "unchanged": (later.unchanged - self.unchanged) * scale,
                "hub_cpu": (later.hub_cpu - self.hub_cpu) / span}


def socket_bytes(port: int) -> tuple[int, int]:
    """(sent, received) over the hub's established connections on ``port``, as the kernel counts them."""
    out = subprocess.run(["ss", "-tinH", "state", "established", f"( sport = :{port} )"], check=True,
                         capture_output=True, text=True).stdout
    sent = sum(int(n) for n in re.findall(r"bytes_sent:(\d+)", out))
    received = sum(int(n) for n in re.findall(r"bytes_received:(\d+)", out))
    return sent, received


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Fleet:
    """A hub process and its stand-in members (in this process's event loop)."""

    def __init__(self, folder: Path, members: int, heartbeat: float, before: bool) -> None:
        self.plan = hub_plan(folder, members, heartbeat)
        self.timings = self.plan.timings
        self.folder = Path(self.plan.paths.job_dir)
        self.folder.mkdir(parents=True)
        (self.folder / layout.PLAN_FILE).write_text(self.plan.to_json())
        (self.folder / layout.SECRET_FILE).write_bytes(SECRET + b"\n")
        keyring = wire.Keyring(SECRET)
        self.standins = [StandIn(dataclasses.replace(self.plan, node=m.name), keyring, i, before)
                         for i, m in enumerate(self.plan.members) if i > 0]
        self.tasks: list[asyncio.Task[None]] = []
        self.pid = 0
        self.addr = ""

    def start_hub(self) -> None:
        out = subprocess.run([sys.executable, "-m", "trainer.runtime", "start", str(self.folder)], cwd=REPO,
                             check=True, capture_output=True, text=True,
                             env={**os.environ, "PYTHONPATH": str(REPO)}).stdout
        started = json.loads(out)
        self.pid, self.addr = int(started["pid"]), str(started["addr"])

    async def join(self, batch: int = 16) -> dict[str, float]:
        """Every stand-in follows the hub, ``batch`` a second (as a launch starts the supervisors: a few at a
        time); until every member holds a record with every member's address: the seconds, the hub's CPU seconds,
        and the bytes the hub sent and received."""
        started, cpu = time.monotonic(), cpu_seconds(self.pid)
        for first in range(0, len(self.standins), batch):
            for each in self.standins[first:first + batch]:
                self.tasks.append(asyncio.get_running_loop().create_task(each.follow(self.addr)))
            await asyncio.sleep(1.0)
        await self.until(lambda: all(len(s.record.directory) == len(self.plan.members) for s in self.standins),
                         self.patience(), "every member to hold a record with every address")
        sent, received = socket_bytes(int(self.addr.rsplit(":", 1)[1]))  # the members' links are still the joins'
        return {"join_s": time.monotonic() - started, "join_hub_cpu_s": cpu_seconds(self.pid) - cpu,
                "join_to_members_B": sent, "join_from_members_B": received}

    async def until(self, done: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            if time.monotonic() > deadline:
                raise RuntimeError(f"watch bench: waited {timeout:.0f} s for {what}\n{self.hub_log()}")
            await asyncio.sleep(0.1)

    def hub_log(self) -> str:
        path = self.folder / layout.LOG_FILE
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    def traffic(self) -> Traffic:
        port = int(self.addr.rsplit(":", 1)[1])
        sent, received = socket_bytes(port)
        return Traffic(time.monotonic(), sent, received, cpu_seconds(self.pid), sum(s.reports for s in self.standins),
                       self.answered(Says.UNCHANGED))

    def answered(self, says: Says) -> int:
        """The hub's answers of this kind the stand-ins received."""
        return sum(s.answers[says] for s in self.standins)

    def newest(self) -> JobRecord:
        return max((s.record for s in self.standins), key=lambda r: (r.term, r.version))

    async def steady(self, periods: int) -> dict[str, float]:
        """The watch over ``periods`` report periods, per period (hub CPU per second)."""
        first = self.traffic()
        await asyncio.sleep(periods * self.timings.report_every)
        return first.per_period(self.traffic(), self.timings.report_every)

    async def kill_trainer(self) -> dict[str, float | None]:
        """A member's trainer dies of SIGKILL: seconds until the hub names it (its own record, state.json), and from
        the hub's start of the next attempt until every member holds it (None: not within ``patience``)."""
        victim = self.standins[len(self.standins) // 2]
        attempt = self.newest().attempt
        victim.stop(-signal.SIGKILL)
        await self.until(lambda: self.hub_named(victim.node), self.timings.loss + 60, f"the hub to name {victim.node}")
        named = self.hub_record()
        first = named.first_failure
        assert first is not None and named.detected_at is not None and first.rc == -signal.SIGKILL, first
        found: dict[str, float | None] = {"detect_s": named.detected_at - first.at, "propagate_median_s": None,
                                          "propagate_max_s": None}
        try:
            await self.until(lambda: all(attempt + 1 in s.learned for s in self.standins), self.patience(),
                             "every member to hold the next attempt")
        except RuntimeError as exc:
            progress(str(exc).splitlines()[0])
            return found
        started = self.hub_record().attempts[attempt + 1].started_at
        delays = [s.learned[attempt + 1] - started for s in self.standins]
        return {**found, "propagate_median_s": statistics.median(delays), "propagate_max_s": max(delays)}

    def hub_record(self) -> JobRecord:
        """The record as the hub last wrote it in its state.json."""
        state = nodestate.node_state(str(self.folder))
        assert state is not None, "the hub wrote no state"
        return state.record

    def hub_named(self, node: str) -> bool:
        first = self.hub_record().first_failure
        return first is not None and first.node == node

    async def silence(self) -> float | None:
        """A member stops reporting (its connection open): seconds from its last report to the hub naming it lost
        (None: the hub named another member first: this process's stand-ins fell behind by the loss time)."""
        index = len(self.standins) // 3
        quiet = self.standins[index]
        await self.until(lambda: all(s.trainer.running for s in self.standins), self.patience(), "every trainer to run")
        # Its whole following stops, as a hung node's: a member only paused would still answer the hub's pushes, and
        # rejoin when its link's read timed out at the loss time, racing the hub's verdict. (Its link closes; the
        # hub judges a member by what it hears, never by its connections.)
        self.tasks[index].cancel()
        try:
            await self.until(lambda: self.hub_named(quiet.node), self.timings.loss + 60,
                             f"the hub to name {quiet.node} lost")
        except RuntimeError as exc:
            first = self.hub_record().first_failure
            progress(f"{str(exc).splitlines()[0]}; the hub named {first.node if first else 'nobody'} "
                     f"({first.reason if first else ''}), lost: {len(self.hub_record().lost)}")
            return None
        record = self.hub_record()
        assert record.detected_at is not None
        return record.detected_at - quiet.last_report

    def patience(self) -> float:
        """How long to wait for every stand-in to hear of a change: each reads it in this one process (on a node,
        each reads it on its own); a member that joins reads the whole record, about 90 ms at 1,024 members here."""
        return 60 + len(self.standins) / 4

    def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        if self.pid:
            deadline = time.monotonic() + 10
            while procs.job_processes(str(self.folder)) and time.monotonic() < deadline:
                procs.signal_all(procs.job_processes(str(self.folder)), signal.SIGKILL)
                time.sleep(0.05)


async def measure(members: int, heartbeat: float = HEARTBEAT_S, before: bool = False,
                  periods: int = 3) -> dict[str, float | None]:
    """Every figure of the watch at ``members`` members (``before``: every report answered with the record). When
    the stand-ins could not all take in the next attempt in time (all read it in this one process), the silent member
    is not measured: None."""
    with tempfile.TemporaryDirectory(prefix="watch-bench-") as tmp:
        fleet = Fleet(Path(tmp), members, heartbeat, before)
        try:
            fleet.start_hub()
            joined = await fleet.join()
            progress(f"{members} members joined: {joined}")
            await asyncio.sleep(fleet.timings.report_every)  # every member has the last address's record
            found: dict[str, float | None] = {
                "members": members, "heartbeat_s": heartbeat, **joined,
                "record_B": len(wire.canonical(fleet.newest().to_json())),
                **await fleet.steady(periods)}
            progress(f"{members} members: steady {found}")
            found.update(await fleet.kill_trainer())
            progress(f"{members} members: the killed trainer named ({found})")
            found["silent_s"] = None if found["propagate_max_s"] is None else await fleet.silence()
            found.update({f"{says}_sent": float(fleet.answered(says)) for says in (Says.RECORD, Says.CHANGES,
                                                                                      Says.UNCHANGED)})
            return found
        finally:
            fleet.close()


def progress(line: str) -> None:
    print(f"watch bench: {line}", file=sys.stderr, flush=True)


def heartbeat_for(members: int) -> float:
    return LARGE_HEARTBEAT_S if members >= LARGE else HEARTBEAT_S


def run(sizes: tuple[int, ...] = SIZES, heartbeat: float | None = None, before: bool = False
        ) -> list[dict[str, float | None]]:
    """Each size's figures, at ``heartbeat`` (default: ``heartbeat_for`` the size)."""
    return [asyncio.run(measure(n, heartbeat or heartbeat_for(n), before)) for n in sizes]


def shown(value: float | None, scale: float = 1.0, digits: int = 1) -> str:
    return "not measured" if value is None else f"{value / scale:.{digits}f}"


def table(rows: list[dict[str, float | None]]) -> str:
    lines = ["| members | heartbeat timeout, s | record, kB | to members, kB/period | from members, kB/period | "
             "reports/period | unchanged/period | hub CPU, s/s | killed trainer named, s | silent member named, s | "
             "next attempt at every member, median / max s | join: s, hub CPU s, MB to / from members |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['members']} | {shown(r['heartbeat_s'], digits=0)} | {shown(r['record_B'], 1e3)} | "
                     f"{shown(r['to_members_B'], 1e3)} | {shown(r['from_members_B'], 1e3)} | "
                     f"{shown(r['reports'], digits=0)} | {shown(r['unchanged'], digits=0)} | "
                     f"{shown(r['hub_cpu'], digits=2)} | {shown(r['detect_s'])} | {shown(r['silent_s'])} | "
                     f"{shown(r['propagate_median_s'])} / {shown(r['propagate_max_s'])} | "
                     f"{shown(r['join_s'], digits=0)}, {shown(r['join_hub_cpu_s'])}, "
                     f"{shown(r['join_to_members_B'], 1e6)} / {shown(r['join_from_members_B'], 1e6)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.watch_scale", description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", type=int, default=list(SIZES))
    parser.add_argument("--heartbeat", type=float, default=None, help=f"default: {HEARTBEAT_S:g} s, "
                        f"{LARGE_HEARTBEAT_S:g} s from {LARGE} members")
    parser.add_argument("--before", action="store_true", help="every report answered with the whole record")
    args = parser.parse_args(argv)
    load = os.getloadavg()[0]
    rows = run(tuple(args.sizes), args.heartbeat, args.before)
    print(table(rows))
    print(f"\n{os.cpu_count()} CPU cores, load average {load:.1f} before, {os.getloadavg()[0]:.1f} after")
    return 0


if __name__ == "__main__":
    sys.exit(main())
