"""Real supervisors on loopback addresses (tests/runtime/loopback.py), each with its own job folder, running the
stand-in trainer: how fast the job's end travels with the default one-minute heartbeat timeout, and a member whose
link task dies (a bug) started again by the supervisor's tick.

A member reports to the hub every heartbeat_timeout/6 seconds (10 s here), but at once when its trainer exits, and
every second while it waits for the hub's answer: a job whose trainers finish at once ends within seconds, not at
the next heartbeats."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.runtime.loopback import NET, REPO, SECRET, Job, loopback, wait_until
from tests.runtime.test_plan import job, plans
from trainer.runtime import layout, schema
from trainer.runtime.job.hub import new_record
from trainer.runtime.job.record import End, EndState, Phase, changes_from, step, with_changes
from trainer.runtime.plan import NodePlan
from trainer.runtime.watch import wire
from trainer.runtime.watch.listener import Listener
from trainer.runtime.watch.member import Member
from trainer.runtime.watch.messages import IDLE, RecordReply, Report, Says
from trainer.runtime.watch.supervisor import Supervisor

__all__ = ["loopback"]
HEARTBEAT_TIMEOUT = 60.0  # the launcher's default: members report every 10 s while their trainers run
KEY = wire.Keyring(SECRET)


def with_watch(job: Job, **watch: float) -> None:
    for name, folder in job.folders.items():
        plan = job.plans[name] = NodePlan.read(str(Path(folder) / layout.PLAN_FILE))
        plan = dataclasses.replace(plan, watch=dataclasses.replace(plan.watch, **watch))
        (Path(folder) / layout.PLAN_FILE).write_text(plan.to_json())


def test_a_job_whose_trainers_exit_ends_within_seconds_not_at_the_next_heartbeat(loopback: Callable[..., Job]
                                                                                  ) -> None:
    job = loopback(2, steps=1)
    with_watch(job, heartbeat_timeout=HEARTBEAT_TIMEOUT)
    started = time.monotonic()
    job.start_all()
    record = job.ended(40)
    took = time.monotonic() - started
    assert record.end is not None and record.end.state == EndState.FINISHED, job.logs()
    assert [job.status(name)["state"] for name in job.names] == ["finished", "finished"]
    # Reports only at heartbeats would take at least one interval (10 s) for the member's exit to reach the hub.
    assert took < HEARTBEAT_TIMEOUT / 6 - 2, f"the job took {took:.1f} s to end"


def test_a_member_whose_link_task_dies_is_started_again_by_the_tick(loopback: Callable[..., Job],
                                                                    monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    job = loopback(2, steps=30)
    job.start("n0")
    follow = Member.follow
    calls: list[str] = []

    async def follow_with_a_bug(self: Member, hub_addr: str) -> None:
        calls.append(hub_addr)
        if len(calls) == 1:
            raise RuntimeError("a bug in the member's loop")
        await follow(self, hub_addr)

    monkeypatch.setattr(Member, "follow", follow_with_a_bug)

    async def supervise() -> Any:
        return await asyncio.wait_for(Supervisor(job.folders["n1"], job.hub_addr).run(), 60)

    assert asyncio.run(supervise()) == 0  # this process is n1's supervisor, until the job's end
    wait_until(lambda: not job.running(), 30, "the hub to leave", job.logs)
    said = capsys.readouterr().out
    assert said.count("the link to the hub failed (RuntimeError: a bug in the member's loop); starting it again") == 1
    assert len(calls) == 2 and job.record().end is not None and job.record().restarts == 0, said


@pytest.mark.parametrize("rejoin", [False, True])
def test_a_rejoining_member_starts_no_trainer_before_it_holds_the_hubs_record(loopback: Callable[..., Job],
                                                                             rejoin: bool) -> None:
    """At a launch a member starts its trainer at once, as the launch's record says (its peers start theirs at the
    same time); one that comes back into a running job (its supervisor died: a rebooted node) holds only that stale
    record, so it waits for the hub's: here the hub never answers, and no trainer starts."""
    job = loopback(2, steps=30)
    supervisor = Supervisor(job.folders["n1"], f"{job.plans['n0'].me.ip}:1", rejoin)  # nobody listens there

    async def a_moment() -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(supervisor.run(), 2)

    asyncio.run(a_moment())
    assert supervisor.node.started_attempts == (set() if rejoin else {0})
    if rejoin:  # and only into a running job: it must be told where its hub is
        refused = subprocess.run([sys.executable, "-m", "trainer.runtime", "start", job.folders["n1"], "--rejoin"],
                                 cwd=REPO, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
        said = refused.stderr.strip()
        assert (refused.returncode, said) == (1, "error: --rejoin needs --hub (the running job's hub)"), said


class EndsWhenItHoldsTheEnd:
    """A member's supervisor at its quickest: done the moment it holds a record that ends the job (its trainer has
    exited), and reporting only at its heartbeat (a minute away) otherwise."""

    def __init__(self, plan: NodePlan) -> None:
        self.plan = plan
        self.record = new_record(plan, time.time())
        self.heard_hub = time.monotonic()

    def report(self, says: Says, term: int | None = None) -> Report:
        return Report(says=says, node=self.plan.node, term=0, addr=f"{self.plan.me.ip}:1", version=self.record.version,
                      trainer=IDLE, trouble=None, progress=None, port_offer=None, record=None, pace=None,
                      timeline=None)

    def adopt(self, reply: RecordReply) -> bool:
        self.record = reply.record or with_changes(self.record, reply.changes) or self.record
        return self.record.end is not None

    def directory(self) -> dict[str, str]:
        return {}

    def is_done(self) -> bool:
        return self.record.end is not None

    def is_hub(self) -> bool:
        return False

    async def until_next_report(self) -> None:
        await asyncio.sleep(HEARTBEAT_TIMEOUT / 6)


@pytest.mark.parametrize("as_changes", [True, False], ids=["as-changes", "as-a-record"])
def test_a_member_that_learns_the_end_tells_the_hub_at_once_before_its_supervisor_leaves(as_changes: bool) -> None:
    """The hub's supervisor stays until every member holds the end: a member whose supervisor leaves the moment it
    learns it must say so first, whether the end came whole or as the changes to its record (CI: the hub left a
    heartbeat timeout, 60 s, after the end, having waited for a member that had left without a word)."""
    plan = plans(job(["/home/a", "/home/b"], net=NET))["n1"]
    local = EndsWhenItHoldsTheEnd(plan)
    launch = local.record
    ended = launch.changed(phase=Phase.ENDED, end=End(EndState.FINISHED, "trained to the end", None))
    found = step(launch, ended)
    assert found is not None
    heard: list[int] = []

    async def hub(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        link, first = await wire.accept(reader, writer, KEY, wire.MAX_LINE)
        heard.append(first["version"])
        end = (RecordReply(says=Says.CHANGES, record=None, changes=changes_from(ended, launch.version, [found]),
                           progress=None) if as_changes else
               RecordReply(says=Says.RECORD, record=ended, changes=None, progress=None))
        await link.send(schema.dump(end))
        try:
            heard.append((await link.recv(3))["version"])
        except wire.Silent:
            heard.append(-1)  # the member waits for its heartbeat

    async def run() -> None:
        server = await asyncio.start_server(hub, f"{NET}.10", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            follow = asyncio.create_task(Member(plan, KEY, local, print).follow(f"{NET}.10:{port}"))
            await asyncio.wait({follow}, timeout=4)
            follow.cancel()

    asyncio.run(run())
    assert heard == [launch.version, ended.version]


def test_an_attempt_or_end_the_hub_posts_reaches_a_member_at_once_not_at_its_next_report() -> None:
    """A member whose trainer runs reports every heartbeat_timeout/6 (10 s here): what the hub posts (an attempt
    started, the end) is pushed down its link by the real listener, adopted at once, and the member says so at once."""
    planned = plans(job(["/home/a", "/home/b"], net=NET))
    local = EndsWhenItHoldsTheEnd(planned["n1"])
    launch = local.record
    ended = launch.changed(phase=Phase.ENDED, end=End(EndState.FINISHED, "trained to the end", None))
    hub = {"record": launch}
    heard: list[tuple[float, int]] = []  # (when, the version the member says it holds)

    def answer(node: str, report: Report) -> RecordReply:
        heard.append((time.monotonic(), report.version))
        if report.version == hub["record"].version:
            return RecordReply(says=Says.UNCHANGED, record=None, changes=None, progress=None)
        return RecordReply(says=Says.RECORD, record=hub["record"], changes=None, progress=None)

    def push(node: str) -> RecordReply | None:
        if heard[-1][1] == hub["record"].version:
            return None
        return RecordReply(says=Says.RECORD, record=hub["record"], changes=None, progress=None, pushed=True)

    async def run() -> float:
        listener = Listener(planned["n0"], KEY, answer, push, print)
        addr = await listener.start()
        follow = asyncio.create_task(Member(planned["n1"], KEY, local, print).follow(addr))
        await asyncio.sleep(1)  # joined, answered, and waiting for its next report (9 s away)
        hub["record"] = ended
        posted = time.monotonic()
        listener.post()
        await asyncio.wait({follow}, timeout=5)
        for _ in range(20):  # the hub's side reads the member's last report
            if len(heard) > 1:
                break
            await asyncio.sleep(0.1)
        follow.cancel()
        listener.close()
        return posted

    posted = asyncio.run(run())
    assert local.record == ended
    assert [version for _, version in heard] == [launch.version, ended.version]
    assert heard[-1][0] - posted < 1, f"the member said it holds the end {heard[-1][0] - posted:.1f} s after the post"
