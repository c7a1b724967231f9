"""A supervisor's link to the job's hub, as a member: report to the hub and adopt its record (``follow``), and when
the hub is lost, look for the next one (``search``, by the rules of trainer.runtime.watch.succession).

Neither loop ends on what a peer says or on a bug: a bad answer (an attacker at the address a member dials, a hub of
another version) is refused, said once, and tried again after a pause; the supervisor's tick restarts the task should
it end anyway (trainer.runtime.watch.supervisor). The connecting side binds its socket to the node's cluster address:
the listeners admit members by their planned addresses (trainer.runtime.watch.listener).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from trainer.runtime import schema
from trainer.runtime.job.timing import Timings
from trainer.runtime.log import Once, Say
from trainer.runtime.plan import NodePlan
from trainer.runtime.watch import succession, wire
from trainer.runtime.watch.messages import RecordReply, Reply, Report, Says, read_reply
from trainer.runtime.watch.succession import Move


class Local(Protocol):
    """What the member needs of its supervisor (trainer.runtime.watch.supervisor.Supervisor)."""

    heard_hub: float  # monotonic: when the hub last answered

    def report(self, says: Says, term: int | None = None) -> Report: ...

    def adopt(self, reply: RecordReply) -> bool: ...  # True: the record it now holds ends the job

    def directory(self) -> Mapping[str, str]: ...

    def is_done(self) -> bool: ...

    def is_hub(self) -> bool: ...

    async def until_next_report(self) -> None: ...


async def until_next_report(news: asyncio.Event, timings: Timings, waiting: bool) -> None:
    """A report's interval, less when the node has news (``news`` set) or waits on the hub (``waiting``: its trainer
    stopped after an attempt started, or a rank's step stalled); ``news`` is cleared."""
    pause = timings.waiting_report if waiting else timings.report_every
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(pause):
            await news.wait()
    news.clear()


class Outcome(StrEnum):
    BECOME_HUB = "become_hub"
    FOLLOW = "follow"
    GAVE_UP = "gave_up"


@dataclass(frozen=True)
class Found:
    """How a search ended: this member is the hub of ``term``, or the hub listens at ``addr``, or no hub was found."""

    outcome: Outcome
    term: int
    addr: str | None = None


class Member:
    def __init__(self, plan: NodePlan, keyring: wire.Keyring, local: Local, say: Say) -> None:
        self.keyring = keyring
        self.local = local
        self.timings = plan.timings
        self.me = plan.node
        self.order = tuple(m.name for m in plan.members)
        self.source = plan.me.ip
        self.limit = wire.line_limit(len(plan.members))
        self.said = Once(say)
        self.links = 0  # connections opened to the hub (a healthy link lasts the whole job)

    def _failed(self, where: str, exc: BaseException) -> None:
        """A link that failed unexpectedly: said once per kind of failure."""
        if not isinstance(exc, TimeoutError | OSError | asyncio.IncompleteReadError | wire.Closed | wire.Silent):
            self.said(f"{where} {type(exc).__name__} {exc}", f"{where}: {type(exc).__name__}: {exc}")

    async def _connect(self, addr: str, first: Report) -> wire.Link:
        return await wire.connect(addr, self.keyring, schema.dump(first), self.timings.dial, source=self.source,
                                  limit=self.limit)

    # -- following the hub -----------------------------------------------------------------------------------------

    async def follow(self, hub_addr: str) -> None:
        """Report to the hub and adopt its record; return once the job is over here, this supervisor became the hub,
        or nothing was heard from the hub for the loss time."""
        while not self.local.is_done() and not self.local.is_hub():
            try:
                await self._report_to(hub_addr)
            except Exception as exc:  # nothing a peer sends ends the loop: said once, retried
                self._failed(f"the link to the hub at {hub_addr}", exc)
            if self.local.is_done() or self.local.is_hub():
                return
            if time.monotonic() - self.local.heard_hub > self.timings.loss:
                return
            await asyncio.sleep(self.timings.retry)

    async def _report_to(self, hub_addr: str) -> None:
        link = await self._connect(hub_addr, self.local.report(Says.JOIN))
        self.links += 1
        try:
            told_end = False
            while not self.local.is_done():
                reply = await self._answer(link)
                if not isinstance(reply, RecordReply):
                    return  # not the hub (any more)
                if self.local.adopt(reply) and not told_end:
                    # the hub stays until every member has the end (as a record or as changes): say so at once,
                    # before this node is done and its supervisor leaves
                    told_end = True
                else:
                    await self._until_next_report(link)
                await link.send(schema.dump(self.local.report(Says.REPORT)))
        finally:
            link.close()

    async def _answer(self, link: wire.Link) -> Reply:
        """The hub's answer to the report just sent; what it pushed before it is adopted on the way."""
        while True:
            reply = read_reply(await link.recv(self.timings.reply_wait))
            if not (isinstance(reply, RecordReply) and reply.pushed):
                return reply
            self.local.adopt(reply)

    async def _until_next_report(self, link: wire.Link) -> None:
        """The pause before the next report, cut short by what the hub pushes (adopted: the member reports at once
        that it holds it, and what its trainer did about it)."""
        pause = asyncio.ensure_future(self.local.until_next_report())
        pushed = asyncio.ensure_future(link.recv(self.timings.loss))
        try:
            await asyncio.wait((pause, pushed), return_when=asyncio.FIRST_COMPLETED)
        finally:
            pause.cancel()
            pushed.cancel()
            # a stream has one reader at a time: the cancelled read must be over before the answer's read starts
            await asyncio.wait((pause, pushed))
        if not pushed.cancelled():
            reply = read_reply(pushed.result())
            if isinstance(reply, RecordReply):
                self.local.adopt(reply)

    # -- looking for the next hub ----------------------------------------------------------------------------------

    async def search(self, lost_hub: str, lost_addr: str | None, term: int, started: float) -> Found:
        """Find the hub of ``term`` or a later one, or be it, unless the lost hub (at ``lost_addr``) answers again;
        give up ``search_give_up`` after ``started``."""
        answer = await self.ask(lost_addr, term - 1)
        step = succession.back_to_lost_hub(self.me, self.order, term, lost_addr, answer)
        while not self.local.is_done() and not self.local.is_hub():
            if step.move == Move.BECOME_HUB:
                return Found(Outcome.BECOME_HUB, term)
            if step.move == Move.ASK:
                asked = self.local.directory().get(succession.candidate(self.order, term))
                step = succession.after_answer(term, asked, await self.ask(asked, term), lost_hub)
                if step.move == Move.ASK_HUB and isinstance(await self.ask(step.addr, term), RecordReply):
                    step = succession.Step(Move.FOLLOW, term, step.addr)
            if step.move == Move.FOLLOW and step.addr:
                return Found(Outcome.FOLLOW, step.term, step.addr)
            term = step.term
            if time.monotonic() - started > self.timings.search_give_up:
                break
            await asyncio.sleep(self.timings.search_pause)
            step = succession.first_step(self.me, self.order, term)
        return Found(Outcome.GAVE_UP, term)

    async def ask(self, addr: str | None, term: int) -> Reply | None:
        """Join the member at ``addr`` as the hub of ``term``: its answer, or None when it cannot be reached or
        answers nothing this runtime can read."""
        if not addr:
            return None
        link = None
        try:
            link = await self._connect(addr, self.local.report(Says.JOIN, term))
            reply = read_reply(await link.recv(self.timings.dial))
        except Exception as exc:  # nothing a peer sends ends the search: said once, asked again
            self._failed(f"asking {addr} to be the hub", exc)
            return None
        finally:
            if link is not None:
                link.close()
        if isinstance(reply, RecordReply):
            self.local.adopt(reply)
        return reply
