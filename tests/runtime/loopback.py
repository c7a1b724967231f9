"""Real supervisors (``python -m trainer.runtime start``) of one job on loopback addresses, 127.0.0.10, .11, ... (one
per member, each its own job folder and home), running the stand-in trainer (tests/runtime/standin.py): the runtime's
fault paths in seconds, without a cluster. A member's "node" is its supervisor and its trainer: killing both is
losing the node.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.conftest import REPO
from tests.runtime.test_plan import job, plans
from trainer.runtime import layout
from trainer.runtime.host import channel, nodestate, procs
from trainer.runtime.host.channel import ProcState
from trainer.runtime.job.record import JobRecord
from trainer.runtime.watch.messages import NodeState

NET = "127.0.0"  # members at NET.10, NET.11, ...
OUTSIDE = f"{NET}.99"  # a host of the network that is no member of the job
SECRET = b"a-test-secret-of-this-job"
STANDIN = Path(__file__).with_name("standin.py")
# Short enough for seconds per fault, long enough for a loaded 2-core machine: a member reports every 0.67 s and
# is lost after 4 s of silence; a stopped trainer is killed after 2 s.
WATCH = {"heartbeat_timeout": 4.0, "stop_grace": 2.0, "startup_timeout": 30.0}


class Job:
    """A job's folders and supervisors on loopback; ``close`` ends every process of the job, by its folder."""

    def __init__(self, tmp_path: Path, nodes: int, spares: int = 0, node_wait: float = 20.0, max_restarts: int = 3,
                 steps: int = 300, env: dict[str, str] | None = None, argv: tuple[str, ...] | None = None,
                 stragglers: dict[str, Any] | None = None, in_place: bool = True,
                 watch: dict[str, float] | None = None, min_nodes: int | None = None) -> None:
        """``steps``: the stand-ins' first attempt (a tenth of a second each; a restarted attempt trains 10 more);
        ``stragglers``: the job description's straggler settings (trainer.runtime.job.straggler); ``watch``: its watch
        settings (WATCH's short ones when None; ``{}``: the job description's defaults); ``min_nodes``: the fewest
        nodes the job trains on (None: every trainer)."""
        homes = [str(tmp_path / f"home{i}") for i in range(nodes + spares)]
        peers = tmp_path / "peers"  # every stand-in of the job says it is there (tests/runtime/standin.py)
        peers.mkdir(parents=True)
        spec = job(homes, spares=spares, net=NET, watch=WATCH if watch is None else watch,
                   restarts={"max_restarts": max_restarts, "node_wait": node_wait, "in_place": in_place,
                             "min_nodes": min_nodes},
                   stragglers=stragglers or {})
        self.plans = plans(spec)
        self.folders: dict[str, str] = {}
        for name, planned in self.plans.items():
            run = planned.paths.run_dir
            plan = dataclasses.replace(
                planned, argv=argv or (sys.executable, *layout.SAFE_PATH, str(STANDIN), "--config-file", "x"),
                env={**planned.env, "PYTHONPATH": str(REPO), "STANDIN_RUN_DIR": run, "STANDIN_STEPS": str(steps),
                     "STANDIN_PEERS": str(peers), **(env or {})})
            folder = Path(plan.paths.job_dir)
            folder.mkdir(parents=True)
            (folder / layout.PLAN_FILE).write_text(plan.to_json())
            (folder / layout.SECRET_FILE).write_bytes(SECRET + b"\n")
            self.folders[name] = str(folder)
        self.names = list(self.folders)
        self.hub_addr = ""

    # -- starting, stopping, breaking ------------------------------------------------------------------------------

    def start(self, name: str) -> dict[str, Any]:
        """Start ``name``'s supervisor (the first one is the hub); what ``start`` printed."""
        hub = ["--hub", self.hub_addr] if self.hub_addr else []
        # PYTHONPATH: the supervisor runs in its job folder (on a node, the layout's entry point points at the code)
        out = subprocess.run([sys.executable, "-m", "trainer.runtime", "start", self.folders[name], *hub], cwd=REPO,
                             check=True, capture_output=True, text=True,
                             env={**os.environ, "PYTHONPATH": str(REPO)}).stdout
        started = json.loads(out)
        self.hub_addr = self.hub_addr or started["addr"]
        return started

    def start_all(self) -> None:
        for name in self.names:
            self.start(name)

    def processes(self, name: str, trainers_only: bool = False) -> list[int]:
        return procs.job_processes(self.folders[name], trainers_only=trainers_only)

    def signal(self, name: str, sig: int, trainers_only: bool = False) -> None:
        procs.signal_all(self.processes(name, trainers_only), sig)

    def lose(self, name: str) -> None:
        """The node is gone: its supervisor and its trainer killed at once."""
        self.signal(name, signal.SIGKILL)
        wait_until(lambda: not self.processes(name), 10, f"{name}'s processes to end",
                   lambda: "\n".join(Path(f"/proc/{pid}/cmdline").read_text() for pid in self.processes(name)))

    def close(self) -> None:
        """Every process of the job killed, again until none is left (a supervisor may start its standby between
        the look and the kill)."""
        deadline = time.monotonic() + 10
        while any(self.processes(name) for name in self.names) and time.monotonic() < deadline:
            for name in self.names:
                self.signal(name, signal.SIGCONT)
                self.signal(name, signal.SIGKILL)
            time.sleep(0.05)

    # -- looking -----------------------------------------------------------------------------------------------------

    def state(self, name: str) -> NodeState:
        state = nodestate.node_state(self.folders[name])
        assert state is not None, f"{name} has no state"
        return state

    def status(self, name: str) -> dict[str, Any]:
        return nodestate.status(self.folders[name])

    def record(self) -> JobRecord:
        """The newest record any member holds."""
        records = [s.record for s in map(nodestate.node_state, self.folders.values()) if s is not None]
        return max(records, key=lambda r: (r.term, r.version))

    def beating(self, name: str) -> bool:
        """A training process beats on ``name`` (the stand-in's signal handlers are in place before it beats)."""
        folder = Path(self.folders[name]) / layout.HEARTBEAT_DIR
        return folder.is_dir() and any(path.name.isdigit() for path in folder.iterdir())

    def running(self) -> list[str]:
        return [name for name in self.names if self.status(name)["state"] == "running"]

    def log(self, name: str) -> str:
        return (Path(self.folders[name]) / layout.LOG_FILE).read_text(errors="replace")

    def run_file(self, name: str, file: str) -> Path:
        return Path(self.plans[name].paths.run_dir) / file

    def attempts(self, name: str) -> list[dict[str, Any]]:
        """What the stand-in with rank 0 on ``name`` recorded of each restarted attempt."""
        path = self.run_file(name, "attempts.jsonl")
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def standby(self, name: str) -> int | None:
        """The pid of ``name``'s standby, once it waits (its report in the node's channel says so)."""
        folder = Path(self.folders[name]) / layout.CHANNEL_DIR
        return next((r.pid for r in channel.processes(folder)
                     if r.state == ProcState.STANDBY and procs.belongs(r.pid, self.folders[name])), None)

    def weights(self, name: str) -> dict[str, Any]:
        """The final "weights" the stand-in on ``name`` wrote at the end (its rank, its step, its weights)."""
        return json.loads(self.run_file(name, "weights.json").read_text())

    def step(self, name: str) -> int:
        try:
            return int(json.loads(self.run_file(name, "status.json").read_text())["step"])
        except (OSError, ValueError, KeyError):
            return 0

    def ended(self, timeout: float = 90) -> JobRecord:
        """Wait until every supervisor has left; the job's last record."""
        wait_until(lambda: not self.running(), timeout, "every supervisor to leave", self.logs)
        return self.record()

    def logs(self) -> str:
        return "\n".join(f"--- {name}\n{self.log(name)[-3000:]}" for name in self.names)


def wait_until(done: Callable[[], Any], timeout: float, what: str, detail: Callable[[], str] = str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = done()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"waited {timeout:.0f} s for {what}\n{detail()}")


@pytest.fixture
def loopback(tmp_path: Path) -> Iterator[Callable[..., Job]]:
    """Makes loopback jobs; every process of each ends with the test, whatever happened."""
    made: list[Job] = []

    def make(*args: Any, **kwargs: Any) -> Job:
        made.append(Job(tmp_path / f"job{len(made)}", *args, **kwargs))
        return made[-1]

    yield make
    for each in made:
        each.close()
