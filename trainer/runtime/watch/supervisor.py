"""A node's supervisor: one process per node and job, started detached by ``python -m trainer.runtime start``.

It runs the node's trainer (trainer.runtime.host.node) as the job's record says, and takes part in the job's watch. Its
parts, one asyncio loop and one thread (no locks):

    listener   trainer.runtime.watch.listener: every supervisor listens on an ephemeral port of its cluster address
               (authenticated: trainer.runtime.watch.wire) and answers members;
    member     trainer.runtime.watch.member: a supervisor that is not the hub reports to the hub every ``report_every``
               seconds (trainer.runtime.job.timing) and adopts its record; it reports at once when its trainer starts,
               exits, fails, parks or reaches a phase of its attempt, and every ``waiting_report`` seconds while its
               trainer has run and does not run now (the hub's next word, the job's end or its next attempt, is what
               it waits for) or while a rank's step has stalled (``Node.stalled``: a hang is judged, and the hung
               node hears it, within moments);
    hub host   trainer.runtime.watch.hubhost: the supervisor that is the job's hub answers with the record, and pushes
               an attempt it stops or starts, or the job's end, down every member's link at once;
    tick       ``Supervisor.tick``, every TICK, and at once when a child process ends, a training process reports
               (the channel's FIFO: trainer.runtime.host.channel) or, on the hub, a member's trainer changed: polls the
               trainer, acts on the record, writes the node's state, and restarts the member's task should it have
               ended.

The hub at launch is the first member (the rank-0 node). A member that has not heard its hub for the loss time stops
its trainer (gloo cannot abort a collective that waits on a lost peer) and looks for the next hub
(trainer.runtime.watch.succession: a pure decision). A hub starts an attempt only while it hears a majority of the
members, and stops its running attempt as soon as it does not (trainer.runtime.job.hub). The others notice its loss only
after the loss time, and a hub that took over waits longer still before its first attempt: by then the old attempt's
processes are gone everywhere (the orderings are checked in trainer.runtime.job.timing). So nodes cut off from a
majority never train, whichever side the old hub is on, and two groups can never both run the job.

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
from collections.abc import Coroutine, Mapping
from pathlib import Path
from typing import Any

from trainer.runtime import layout
from trainer.runtime.host import channel, nodestate
from trainer.runtime.host.node import Node
from trainer.runtime.job.hub import Hub, new_record
from trainer.runtime.job.record import End, EndState, Kind, with_changes
from trainer.runtime.job.timing import TICK
from trainer.runtime.log import Once, say
from trainer.runtime.plan import NodePlan
from trainer.runtime.schema import JsonObject, dump
from trainer.runtime.watch import succession, wire
from trainer.runtime.watch.hubhost import HubHost
from trainer.runtime.watch.listener import Listener
from trainer.runtime.watch.member import Member, Outcome, until_next_report
from trainer.runtime.watch.messages import Mode, NodeState, NotHub, RecordReply, Reply, Report, Says, joined_with


class Supervisor:
    def __init__(self, job_dir: str, hub_addr: str | None, rejoin: bool = False) -> None:
        """``rejoin``: this member comes back into the running job (its supervisor died): the launch's record it
        starts with is stale, so its node starts no trainer before it holds the hub's."""
        self.job_dir = job_dir
        self.rejoin = rejoin
        self.plan = NodePlan.read(str(Path(job_dir) / layout.PLAN_FILE))
        keyring = wire.Keyring((Path(job_dir) / layout.SECRET_FILE).read_bytes().strip())
        self.me = self.plan.node
        self.order = tuple(m.name for m in self.plan.members)
        self.timings = self.plan.timings
        self.node = Node(self.plan, say)
        self.record = new_record(self.plan, time.time())  # attempt 0, as the launch planned it
        self.progress: JsonObject | None = None
        self.mode = Mode.MEMBER
        self.term = 0
        self.hub_addr = hub_addr
        self.heard_hub = time.monotonic()
        self.host: HubHost | None = None
        self.listener = Listener(self.plan, keyring, self.answer, self.push, say)
        self.member = Member(self.plan, keyring, self, say)
        self.member_task: asyncio.Task[None] | None = None
        self.lost_hub = ""  # the hub this member lost, while it searches
        self.search_started = 0.0
        self.end: End | None = None  # how the job ended, as this node knows it
        self.done = asyncio.Event()
        self.wake = asyncio.Event()  # tick now: a child exited, a trainer reported, a member's trainer changed
        self.news = asyncio.Event()  # this node's trainer changed (started, exited, failed): tell the hub now
        self.trainer_seen: tuple[Any, ...] = ()
        self.last_state: Any = None
        self.said = Once(say)

    # -- start and stop --------------------------------------------------------------------------------------------

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGUSR1):
            loop.add_signal_handler(sig, self.on_signal, sig)
        loop.add_signal_handler(signal.SIGCHLD, self.wake.set)  # its trainer (or standby) ended
        loop.add_reader(self.node.wake_fd, self.on_trainer_report)
        await self.listener.start()
        if self.hub_addr is None:
            self.become_hub(0, None)
        else:
            self.member_task = self.spawn(self.membership())
        if not self.rejoin:  # at a launch, every trainer starts at once; a rejoining one as the hub's record says
            self.node.reconcile(self.record)
        self.write_state()
        say(f"supervising {self.me} of job {self.plan.job} ({self.mode}; the watch listens on {self.listener.addr})")
        try:
            while not self.done.is_set():
                self.wake.clear()
                self.tick()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(TICK):
                        await self.wake.wait()
        finally:
            self.listener.close()
            self.node.kill_now()
            self.write_state()
        return 0

    def spawn(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        return asyncio.get_running_loop().create_task(work)

    def on_signal(self, sig: int) -> None:
        request = nodestate.stop_request(self.job_dir, os.getpid())
        if request is not None:
            say(f"stop requested by {request.by}: {request.reason}")
            self.node.checkpoint_and_stop(Kind.STOPPED, f"stopped by {request.by}: {request.reason}")
            if not self.node.running:
                self.finish(End(EndState.STOPPED, request.reason, None))
        else:
            name = signal.Signals(sig).name
            say(f"{name}: preempted; the trainer checkpoints and stops")
            self.node.checkpoint_and_stop(Kind.PREEMPTED, f"the node was asked to make way ({name})")
            self.node.stop_asked = False  # a preempted node may train again in the next attempt

    def on_trainer_report(self) -> None:
        """A training process wrote its report (trainer.runtime.host.channel): tick now."""
        channel.drain(self.node.wake_fd)
        self.wake.set()

    def finish(self, end: End, said: bool = False) -> None:
        """The job is over for this node (``said``: the hub has logged why already)."""
        if self.end is None:
            self.end = end
            if not said:
                say(f"the job {end.state}: {end.reason}")
        self.done.set()
        self.wake.set()

    # -- every moment ----------------------------------------------------------------------------------------------

    def tick(self) -> None:
        now = time.monotonic()
        self.node.poll()
        seen = (self.node.trainer.attempt, self.node.trainer.state, self.node.trouble is not None,
                self.node.timeline(), self.node.standby_ready())
        if seen != self.trainer_seen:
            self.trainer_seen = seen
            self.news.set()
        if self.host is not None:
            if self.host.tick(self.report(Says.REPORT), now, time.time()):
                self.listener.post()
            self.record, self.progress = self.host.hub.record, self.host.hub.progress
            self.node.reconcile(self.record)
            nodestate.write_json(Path(self.job_dir) / layout.WATCH_FILE, self.host.snapshot(
                now, time.time(), self.listener.joins, self.listener.refusals.snapshot(), self.listener.addr))
            if self.record.end is not None and not self.node.running and self.host.members_know_end(now):
                self.finish(self.record.end, said=True)
        else:
            if self.record.end is not None and not self.node.running:
                self.finish(self.record.end)
            if self.node.stop_asked and not self.node.running and self.node.trainer.rc != 0:
                # (a trainer that exited 0 trained to the end before the stop could: the hub's record says finished)
                trouble = self.node.trouble
                self.finish(End(EndState.STOPPED, trouble.reason if trouble else "stopped", None))
            self.keep_member_alive()
        self.write_state()

    def keep_member_alive(self) -> None:
        """A member's task that ended while this node still follows a hub (a bug): said once, started again."""
        task = self.member_task
        if task is None or not task.done() or self.done.is_set() or self.host is not None:
            return
        if not task.cancelled() and task.exception() is not None:
            error = task.exception()
            self.said(f"member {type(error).__name__}", f"the link to the hub failed ({type(error).__name__}: "
                      f"{error}); starting it again")
        self.member_task = self.spawn(self.membership())

    def write_state(self) -> None:
        state = NodeState(pid=os.getpid(), node=self.me, mode=self.mode, term=self.term, addr=self.listener.addr,
                          trainer=self.node.trainer, record=self.record, progress=self.progress, end=self.end,
                          updated=0.0)
        if state != self.last_state:
            nodestate.write_json(Path(self.job_dir) / layout.STATE_FILE, {**dump(state), "updated": time.time()})
            self.last_state = state

    # -- what this member says (trainer.runtime.watch.member.Local) ----------------------------------------------------

    def report(self, says: Says, term: int | None = None) -> Report:
        rank0 = self.record.rank0 == self.me
        return Report(says=says, node=self.me, term=self.term if term is None else term, addr=self.listener.addr,
                      version=self.record.version, trainer=self.node.trainer, trouble=self.node.trouble,
                      progress=self.node.progress() if rank0 else None, port_offer=self.node.port_offer(),
                      record=joined_with(says, self.record), pace=self.node.pace(),
                      timeline=self.node.timeline(), ranks=self.node.ranks(), standby=self.node.standby_ready())

    def adopt(self, reply: RecordReply) -> bool:
        """The hub's answer: its record (newer ones only), or the changes to this one, and the run's progress.
        Whether the record this node now holds ends the job."""
        record = reply.record or with_changes(self.record, reply.changes)
        if record is not None and record.job == self.record.job and record.newer_than(self.record):
            self.record = record
            self.term = max(self.term, record.term)
        self.progress = reply.progress
        self.heard_hub = time.monotonic()
        self.node.reconcile(self.record)
        return self.record.end is not None

    def directory(self) -> Mapping[str, str]:
        return self.record.directory

    def is_done(self) -> bool:
        return self.done.is_set()

    def is_hub(self) -> bool:
        return self.host is not None

    async def until_next_report(self) -> None:
        """A report's interval, less when this node has news or waits on the hub (see the module docstring)."""
        await until_next_report(self.news, self.timings,
                                waiting=(not self.node.running and bool(self.node.started_attempts))
                                or self.node.stalled())

    # -- the listener's question -----------------------------------------------------------------------------------

    def answer(self, node: str, report: Report) -> Reply:
        """The reply to a member: the record when this supervisor is the hub, else where the hub is."""
        if report.says == Says.JOIN and succession.takes_over(self.me, self.order, self.mode, self.term, report.term):
            self.become_hub(report.term, self.lost_hub or self.record.hub)
        if self.host is None:
            hub = self.record.hub
            return NotHub(says=Says.NOT_HUB, hub=hub, term=self.term, searching=self.mode == Mode.SEARCHING,
                          addr=self.record.directory.get(hub))
        reply, news = self.host.answer(node, report, time.monotonic())
        if news:
            self.wake.set()  # the hub acts on a member's trainer that changed at once, not at its next tick
        return reply

    def push(self, node: str) -> RecordReply | None:
        """What the hub pushes to a member between its reports (the listener asks after a post)."""
        return self.host.push(node) if self.host is not None else None

    # -- the hub ---------------------------------------------------------------------------------------------------

    def become_hub(self, term: int, lost_hub: str | None) -> None:
        self.term, self.mode = term, Mode.HUB
        now = time.monotonic()
        hub = Hub(self.plan, self.record, term, now, time.time(), say, lost_hub=lost_hub if term > 0 else None)
        # the run's progress as the old hub last told this member: the step a lost attempt reached is on record
        hub.progress = self.progress
        self.host = HubHost(hub)
        self.host.tick(self.report(Says.REPORT), now, time.time())
        self.record = hub.record
        if term > 0:
            say(f"this node is the job's hub now (term {term}; {lost_hub} was lost)")

    # -- a member's part -------------------------------------------------------------------------------------------

    async def membership(self) -> None:
        """Follow the hub; when it is lost, stop the trainer and look for the next one (see the module docstring)."""
        while not self.done.is_set() and self.host is None:
            if self.mode == Mode.MEMBER:
                await self.member.follow(str(self.hub_addr))
                if self.done.is_set() or self.host is not None:
                    return
                hub = self.record.hub
                say(f"nothing heard from the hub ({hub} at {self.hub_addr}) for {self.timings.loss:.0f} s")
                self.node.leave(f"lost contact with the job's hub ({hub})")
                self.mode, self.lost_hub, self.search_started = Mode.SEARCHING, hub, time.monotonic()
                continue
            found = await self.member.search(self.lost_hub, self.hub_addr, self.term + 1, self.search_started)
            if self.done.is_set() or self.host is not None:
                return
            if found.outcome == Outcome.BECOME_HUB:
                self.become_hub(found.term, self.lost_hub)
            elif found.outcome == Outcome.FOLLOW:
                self.mode, self.hub_addr = Mode.MEMBER, found.addr
            else:
                self.finish(End(EndState.FAILED, f"no hub heard by a majority of the job's members within "
                                f"{self.timings.search_give_up:.0f} s after {self.lost_hub} was lost", None))


def main(job_dir: str, hub_addr: str | None, rejoin: bool = False) -> int:
    try:
        supervisor = Supervisor(job_dir, hub_addr, rejoin)
    except (OSError, ValueError) as exc:
        print(f"supervisor: cannot supervise {job_dir}: {exc}", file=sys.stderr, flush=True)
        return 2
    return asyncio.run(supervisor.run())
