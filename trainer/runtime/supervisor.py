"""A node's supervisor: one process per node and job, started detached by ``python -m trainer.runtime start``.

It runs the node's trainer (trainer.runtime.node) as the job's record says, and takes part in the job's watch:
every supervisor listens on an ephemeral port of its cluster address (authenticated: trainer.runtime.wire); one of
them is the job's hub (trainer.runtime.hub), the others report to it every heartbeat_timeout/6 seconds and start or
stop their trainers by the record it answers with. A member reports at once when its trainer starts, exits or fails,
and every second while its trainer has run and does not run now (the hub's next word, the job's end or its next
attempt, is what it waits for): an exit is not left to the next heartbeat. One asyncio loop, one thread: no locks.

The hub at launch is the first member (the rank-0 node). A member that has not heard its hub for heartbeat_timeout
seconds stops its trainer (gloo cannot abort a collective that waits on a lost peer) and looks for the next hub:
hubs succeed each other in member order (trainers by node rank, then spares), by term: the hub of term ``t`` is
member ``t mod M``. The member names that candidate in a join; a candidate that is itself looking for a hub takes the
term and becomes hub, one that still hears a hub points to it, one that cannot be reached moves the term on. A hub
starts an attempt only while it hears a majority of the members (within half the heartbeat timeout), and stops its
running attempt as soon as it does not (trainer.runtime.hub). The others notice its loss only after a whole heartbeat
timeout, and a hub that took over waits a stop grace more before its first attempt: by then the old attempt's
processes are gone everywhere. So nodes cut off from a majority never train, whichever side the old hub is on, and
two groups can never both run the job.

Signals: SIGTERM or SIGUSR1 with a stop request (stop-training.yml) is a user's stop: the trainer checkpoints at a
common step, the job ends "stopped". Without a request they are a preemption: the trainer checkpoints and exits, and
the restart policy applies.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from trainer.runtime import layout, nodestate, wire
from trainer.runtime.hub import Hub, new_record
from trainer.runtime.node import Node
from trainer.runtime.plan import NodePlan

MAX_CONNECTIONS = 64  # plus 2 per member: a flood of connections never costs more than this many at once
TICK = 0.5
WAITING_REPORT_S = 1.0  # how often a member whose trainer has stopped asks the hub what comes next


def say(message: str) -> None:
    """A line in the node's train.log (the supervisor's stdout)."""
    print(f"jobctl: {message} at {time.strftime('%F %T')}", flush=True)


def newer(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Is record ``a`` newer than ``b`` (a later hub's term first, then the version)?"""
    return (a.get("term", 0), a.get("version", 0)) > (b.get("term", 0), b.get("version", 0))


class Supervisor:
    def __init__(self, job_dir: str, hub_addr: str | None) -> None:
        self.job_dir = job_dir
        self.plan = NodePlan.read(str(Path(job_dir) / layout.PLAN_FILE))
        self.keyring = wire.Keyring((Path(job_dir) / layout.SECRET_FILE).read_bytes().strip())
        self.me = self.plan.node
        self.order = [m.name for m in self.plan.members]
        self.timeout = self.plan.watch.heartbeat_timeout
        self.interval = max(0.5, self.timeout / 6)
        self.node = Node(self.plan, say)
        self.record = new_record(self.plan, time.time())  # attempt 0, as the launch planned it
        self.progress: dict[str, Any] | None = None
        self.hub: Hub | None = None
        self.mode = "member"
        self.term = 0
        self.hub_addr = hub_addr
        self.heard_hub = time.monotonic()
        self.addr = ""
        self.connections = 0
        self.refused: dict[str, int] = {}  # peer address -> connections refused (each address is logged once)
        self.end: dict[str, Any] | None = None  # how the job ended, as this node knows it
        self.acked: dict[str, int] = {}  # the hub: the record version each member last reported having
        self.done = asyncio.Event()
        self.news = asyncio.Event()  # this node's trainer changed (started, exited, failed): tell the hub now
        self.trainer_seen: tuple[Any, ...] = ()
        self.last_state: str = ""
        self.tasks: set[asyncio.Task[None]] = set()

    # -- start and stop --------------------------------------------------------------------------------------------

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGUSR1):
            loop.add_signal_handler(sig, self.on_signal, sig)
        ip = self.plan.me.ip
        server = await asyncio.start_server(self.serve, host=ip, port=0, limit=wire.MAX_LINE)
        self.addr = f"{layout.url_host(ip)}:{server.sockets[0].getsockname()[1]}"
        if self.hub_addr is None:
            self.become_hub(0, None)
        else:
            self.spawn(self.follow())
        self.node.reconcile(self.record)
        self.write_state()
        say(f"supervising {self.plan.node} of job {self.plan.job} ({self.mode}; the watch listens on {self.addr})")
        try:
            while not self.done.is_set():
                self.tick()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self.done.wait(), TICK)
        finally:
            server.close()
            self.node.kill_now()
            self.write_state()
        return 0

    def spawn(self, work: Any) -> None:
        """Run a coroutine beside the ticks (keeping a reference: the loop holds tasks only weakly)."""
        task = asyncio.get_running_loop().create_task(work)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def on_signal(self, sig: int) -> None:
        request = nodestate.stop_request(self.job_dir, self.pid)
        if request is not None:
            say(f"stop requested by {request['by']}: {request['reason']}")
            self.node.checkpoint_and_stop("stopped", f"stopped by {request['by']}: {request['reason']}")
            if not self.node.running:
                self.finish({"state": "stopped", "reason": request["reason"]})
        else:
            name = signal.Signals(sig).name
            say(f"{name}: preempted; the trainer checkpoints and stops")
            self.node.checkpoint_and_stop("preempted", f"the node was asked to make way ({name})")
            self.node.stop_asked = False  # a preempted node may train again in the next attempt

    @property
    def pid(self) -> int:
        return os.getpid()

    def finish(self, end: dict[str, Any], said: bool = False) -> None:
        """The job is over for this node (``said``: the hub has logged why already)."""
        if self.end is None:
            self.end = end
            if not said:
                say(f"the job {end['state']}: {end['reason']}")
        self.done.set()

    # -- every moment ----------------------------------------------------------------------------------------------

    def tick(self) -> None:
        now = time.monotonic()
        self.node.poll()
        seen = (self.node.trainer["attempt"], self.node.trainer["state"], self.node.failure is not None)
        if seen != self.trainer_seen:
            self.trainer_seen = seen
            self.news.set()
        if self.hub is not None:
            self.hub.heard(self.me, self.report_body("report"), now)
            self.hub.tick(now, time.time())
            self.record, self.progress = self.hub.record, self.hub.progress
            self.node.reconcile(self.record)
            nodestate.write_json(Path(self.job_dir) / layout.WATCH_FILE,
                                 {**self.hub.snapshot(now), "refused": self.refused, "addr": self.addr})
            if self.record["end"] is not None and not self.node.running and self.members_know_end(now):
                self.finish(self.record["end"], said=True)
        elif self.record["end"] is not None and not self.node.running:
            self.finish(self.record["end"])
        if self.node.stop_asked and not self.node.running and self.hub is None:
            self.finish({"state": "stopped", "reason": (self.node.failure or {}).get("reason", "stopped")})
        self.write_state()

    def members_know_end(self, now: float) -> bool:
        """The hub stays until every member still heard has the record that ends the job (or a timeout passes)."""
        assert self.hub is not None
        version = self.record["version"]
        waiting = [name for name, view in self.hub.members.items() if name != self.me
                   and view.heard is not None and now - view.heard < self.timeout and self.acked.get(name, 0) < version]
        return not waiting

    def write_state(self) -> None:
        state = {"pid": self.pid, "node": self.me, "mode": self.mode, "term": self.term, "addr": self.addr,
                 "trainer": self.node.trainer, "record": self.record, "progress": self.progress, "end": self.end}
        text = repr(sorted(state.items()))
        if text != self.last_state:
            nodestate.write_json(Path(self.job_dir) / layout.STATE_FILE, {**state, "updated": time.time()})
            self.last_state = text

    # -- what this member says to the hub --------------------------------------------------------------------------

    def report_body(self, kind: str) -> dict[str, Any]:
        rank0 = self.record["assignment"].get(self.me) == 0
        body = {"type": kind, "node": self.me, "term": self.term, "addr": self.addr,
                "version": self.record["version"], **self.node.report(rank0)}
        if kind == "join":
            body["record"] = self.record
        return body

    def adopt(self, reply: dict[str, Any]) -> None:
        """The hub's answer: its record (newer ones only) and the run's progress."""
        record = reply.get("record")
        if isinstance(record, dict) and newer(record, self.record):
            self.record = record
            self.term = max(self.term, int(record.get("term", 0)))
        self.progress = reply.get("progress", self.progress)
        self.heard_hub = time.monotonic()
        self.node.reconcile(self.record)

    # -- the listening side (every supervisor) ---------------------------------------------------------------------

    def refuse(self, peer: str, why: str) -> None:
        count = self.refused.get(peer, 0)
        self.refused[peer] = count + 1
        if count == 0 and len(self.refused) <= 100:
            say(f"refused a connection from {peer}: {why} (said once per address)")

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = str((writer.get_extra_info("peername") or ("?",))[0])
        if self.connections >= MAX_CONNECTIONS + 2 * len(self.order):
            self.refuse(peer, "too many connections")
            writer.close()
            return
        self.connections += 1
        try:
            link, body = await wire.accept(reader, writer, self.keyring)
            node = body.get("node")
            if node not in self.order or node == self.me:
                self.refuse(peer, f"it claims to be {node!r}, which is not another member of this job")
                return
            while True:
                reply = self.answer(str(node), body)
                await link.send(reply)
                if reply["type"] != "record":
                    return
                body = await link.recv(self.timeout)
        except wire.Closed:
            pass
        except wire.WireError as exc:
            self.refuse(peer, str(exc))
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            self.connections -= 1
            writer.close()

    def answer(self, node: str, body: dict[str, Any]) -> dict[str, Any]:
        """The reply to a member: the record when this supervisor is the hub, else where the hub is."""
        term = int(body.get("term", 0))
        if (self.hub is None and self.mode == "searching" and body.get("type") == "join"
                and term >= self.term and self.order[term % len(self.order)] == self.me):
            self.become_hub(term, self.record.get("hub"))
        if self.hub is None:
            hub = self.record.get("hub")
            return {"type": "not_hub", "hub": hub, "term": self.term, "searching": self.mode == "searching",
                    "addr": self.record["directory"].get(hub)}
        now = time.monotonic()
        if isinstance(body.get("record"), dict):
            self.hub.adopt(body["record"])
        self.hub.heard(node, body, now)
        self.acked[node] = int(body.get("version", 0))
        return {"type": "record", "record": self.hub.record, "progress": self.hub.progress}

    # -- the hub ---------------------------------------------------------------------------------------------------

    def become_hub(self, term: int, lost_hub: str | None) -> None:
        self.term, self.mode = term, "hub"
        self.hub = Hub(self.plan, self.record, term, time.monotonic(), time.time(), say,
                       lost_hub=lost_hub if term > 0 else None)
        # the run's progress as the old hub last told this member: the step a lost attempt reached is on record
        self.hub.progress = self.progress
        self.hub.heard(self.me, self.report_body("report"), time.monotonic())
        self.record = self.hub.record
        if term > 0:
            say(f"this node is the job's hub now (term {term}; {lost_hub} was lost)")

    # -- a member's link to the hub --------------------------------------------------------------------------------

    async def follow(self) -> None:
        """Report to the hub and adopt its record until the job ends or the hub is lost."""
        while not self.done.is_set() and self.hub is None:
            link = None
            try:
                link = await wire.connect(str(self.hub_addr), self.keyring, self.report_body("join"),
                                          min(5.0, self.timeout))
                told_end = False
                while not self.done.is_set():
                    reply = await link.recv(self.interval * 2 + 5)
                    if reply.get("type") != "record":
                        break
                    self.adopt(reply)
                    if self.record["end"] is None or told_end:
                        await self.until_next_report()
                    else:  # the hub stays until every member has the end: say so at once, before this node is done
                        told_end = True
                    await link.send(self.report_body("report"))
            except (TimeoutError, wire.WireError, OSError, ValueError):
                pass
            finally:
                if link is not None:
                    link.close()
            if self.done.is_set():
                return
            if time.monotonic() - self.heard_hub > self.timeout:
                hub = self.record.get("hub")
                say(f"nothing heard from the hub ({hub} at {self.hub_addr}) for {self.timeout:.0f} s")
                self.node.stop(f"lost contact with the job's hub ({hub})", signal.SIGTERM)
                await self.search(lost_hub=str(hub))
                return
            await asyncio.sleep(min(2.0, self.interval))

    async def until_next_report(self) -> None:
        """A heartbeat's interval, less when this node has news or waits on the hub (see the module docstring)."""
        waiting = not self.node.running and bool(self.node.started_attempts)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.news.wait(), min(self.interval, WAITING_REPORT_S) if waiting else self.interval)
        self.news.clear()

    async def search(self, lost_hub: str) -> None:
        """Find the job's next hub, or become it (see the module docstring); give up after the plan's node wait."""
        self.mode = "searching"
        started = time.monotonic()
        give_up = max(self.plan.restarts.node_wait, 3 * self.timeout)
        term = self.term + 1
        while not self.done.is_set() and self.hub is None:
            candidate = self.order[term % len(self.order)]
            if candidate == self.me:
                self.become_hub(term, lost_hub)
                return
            reply = await self.ask(self.record["directory"].get(candidate), term)
            if reply is not None and reply.get("type") == "record":
                self.hub_addr = self.record["directory"].get(candidate)
                break
            elsewhere = (reply or {}).get("addr")
            if reply is not None and not reply.get("searching") and reply.get("hub") not in (lost_hub, None):
                reply = await self.ask(elsewhere, term)  # the candidate hears another hub: join it
                if reply is not None and reply.get("type") == "record":
                    self.hub_addr = elsewhere
                    break
            if reply is None:
                term += 1  # the candidate cannot be reached: the next member is the candidate
            if time.monotonic() - started > give_up:
                self.finish({"state": "failed", "reason": f"no hub heard by a majority of the job's members within "
                             f"{give_up:.0f} s after {lost_hub} was lost"})
                return
            await asyncio.sleep(min(3.0, self.timeout / 4))
        if self.hub is None and not self.done.is_set():
            self.mode = "member"
            self.spawn(self.follow())

    async def ask(self, addr: str | None, term: int) -> dict[str, Any] | None:
        """Join the member at ``addr`` as the hub of ``term``: its answer, or None when it cannot be reached."""
        if not addr:
            return None
        link = None
        try:
            link = await wire.connect(addr, self.keyring, {**self.report_body("join"), "term": term},
                                      min(5.0, self.timeout))
            reply = await link.recv(min(5.0, self.timeout))
        except (TimeoutError, wire.WireError, OSError, ValueError):
            return None
        finally:
            if link is not None:
                link.close()
        if reply.get("type") == "record":
            self.adopt(reply)
        return reply


def main(job_dir: str, hub_addr: str | None) -> int:
    try:
        supervisor = Supervisor(job_dir, hub_addr)
    except (OSError, ValueError) as exc:
        print(f"jobctl: cannot supervise {job_dir}: {exc}", file=sys.stderr, flush=True)
        return 2
    return asyncio.run(supervisor.run())
