"""Two real supervisors (``python -m trainer.runtime start``) on loopback addresses, each with its own job folder,
running a stand-in trainer: how fast the job's end travels with the default one-minute heartbeat timeout.

A member reports to the hub every heartbeat_timeout/6 seconds (10 s here), but at once when its trainer exits, and
every second while it waits for the hub's answer: a job whose trainers finish at once ends within seconds, not at
the next heartbeats."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.cluster.conftest import REPO
from tests.runtime.test_plan import job, plans
from trainer.runtime import layout, nodestate, procs

HEARTBEAT_TIMEOUT = 60.0  # the launcher's default: members report every 10 s while their trainers run


def write_job(tmp_path: Path) -> list[str]:
    """The job folders of a hub (n0, 127.0.0.10) and a member (n1, 127.0.0.11) whose trainers exit 0 at once."""
    spec = job([str(tmp_path / "home0"), str(tmp_path / "home1")], net="127.0.0",
               watch={"heartbeat_timeout": HEARTBEAT_TIMEOUT})
    folders = []
    for planned in plans(spec).values():
        plan = dataclasses.replace(planned, argv=(sys.executable, "-c", "pass"))
        folder = Path(plan.paths.job_dir)
        folder.mkdir(parents=True)
        (folder / layout.PLAN_FILE).write_text(plan.to_json())
        (folder / layout.SECRET_FILE).write_text("a-test-secret-of-this-job\n")
        folders.append(str(folder))
    return folders


def start(folder: str, *hub: str) -> dict:
    # PYTHONPATH: the supervisor runs in its job folder (on a node, the layout's entry point points at the code)
    out = subprocess.run([sys.executable, "-m", "trainer.runtime", "start", folder, *hub], cwd=REPO, check=True,
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)}).stdout
    return json.loads(out)


def test_a_job_whose_trainers_exit_ends_within_seconds_not_at_the_next_heartbeat(tmp_path: Path) -> None:
    hub_dir, member_dir = write_job(tmp_path)
    started = time.monotonic()
    try:
        start(member_dir, "--hub", start(hub_dir)["addr"])
        while time.monotonic() - started < 40 and any(
            nodestate.status(d)["state"] == "running" for d in (hub_dir, member_dir)
        ):
            time.sleep(0.1)
        took = time.monotonic() - started
        states = [nodestate.status(d) for d in (hub_dir, member_dir)]
        assert [s["state"] for s in states] == ["finished", "finished"], states
        # Reports only at heartbeats would take at least one interval (10 s) for the member's exit to reach the hub.
        assert took < HEARTBEAT_TIMEOUT / 6 - 2, f"the job took {took:.1f} s to end"
    finally:  # whatever of the job is left, by pid, and only while the pid is still the job's
        for folder in (hub_dir, member_dir):
            procs.signal_all(procs.job_processes(folder), signal.SIGKILL)
