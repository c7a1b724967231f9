"""Real supervisors on loopback addresses (tests/runtime/loopback.py), each with its own job folder, running the
stand-in trainer: how fast the job's end travels with the default one-minute heartbeat timeout, and a member whose
link task dies (a bug) started again by the supervisor's tick.

A member reports to the hub every heartbeat_timeout/6 seconds (10 s here), but at once when its trainer exits, and
every second while it waits for the hub's answer: a job whose trainers finish at once ends within seconds, not at
the next heartbeats."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.runtime.loopback import Job, loopback, wait_until
from trainer.runtime import layout
from trainer.runtime.member import Member
from trainer.runtime.plan import NodePlan
from trainer.runtime.record import EndState
from trainer.runtime.supervisor import Supervisor

__all__ = ["loopback"]
HEARTBEAT_TIMEOUT = 60.0  # the launcher's default: members report every 10 s while their trainers run


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
