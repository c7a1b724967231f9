"""The node's record of a job (state.json, written by its supervisor alone), a user's stop request (stop.request,
written by the stop verb alone), the watch's key (secret: the keep-secret verb, or the Slurm batch step, writes it),
and the node's state as ``training-status.yml`` shows it.

Node states: none (never started here), running (its supervisor is up), finished, failed or stopped (how the job
ended, as this node heard it from the hub), killed (its supervisor is gone without hearing an end: killed, or the
machine went away).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer.runtime import atomic, layout
from trainer.runtime.host import procs
from trainer.runtime.schema import SchemaError, dump, parse
from trainer.runtime.watch import wire
from trainer.runtime.watch.messages import Mode, NodeState

TAIL_LINES = 25


@dataclass(frozen=True)
class StopRequest:
    """A request to stop the job here (stop.request), to the supervisor ``pid``: who asked, why, when (wall clock)."""

    pid: int
    by: str
    reason: str
    at: float


def read_json(path: str | Path) -> dict[str, Any] | None:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_json(path: str | Path, payload: dict[str, Any]) -> None:
    """Readers (the controller, another verb) never see half a file: write beside it, then rename over it."""
    atomic.write(path, json.dumps(payload))


def log_tail(job_dir: str, lines: int = TAIL_LINES) -> list[str]:
    try:
        with (Path(job_dir) / layout.LOG_FILE).open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 64 * 1024))
            text = handle.read().decode(errors="replace")
    except OSError:
        return []
    # A progress bar rewrites its line with carriage returns; keep what the last rewrite shows.
    return [line.rsplit("\r", 1)[-1] for line in text.splitlines()[-lines:]]


def keep_secret(job_dir: str, secret: bytes) -> dict[str, Any]:
    """Write the watch's key: a new file made 0600 by the call that creates it, then renamed over the old one."""
    try:
        wire.Keyring(secret)  # refuses a key too short to be one
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    atomic.write(Path(job_dir) / layout.SECRET_FILE, secret + b"\n", atomic.PRIVATE)
    return {"changed": True}


def request_stop(job_dir: str, pid: int, by: str, reason: str) -> None:
    """Ask the supervisor ``pid`` to stop the job here (a request for another pid is an old one: ignored)."""
    write_json(Path(job_dir) / layout.STOP_REQUEST_FILE, dump(StopRequest(pid, by, reason, time.time())))


def stop_request(job_dir: str, pid: int) -> StopRequest | None:
    """The request to the supervisor ``pid``; None when there is none (or none this runtime can read)."""
    try:
        request = parse(StopRequest, read_json(Path(job_dir) / layout.STOP_REQUEST_FILE), layout.STOP_REQUEST_FILE)
    except SchemaError:
        return None
    return request if request.pid == pid else None


def node_state(job_dir: str) -> NodeState | None:
    """The node's state as its supervisor last wrote it; None when there is none (or none this runtime can read: a
    job folder left by another version)."""
    data = read_json(Path(job_dir) / layout.STATE_FILE)
    if data is None:
        return None
    try:
        return NodeState.read(data, layout.STATE_FILE)
    except SchemaError:
        return None


def supervisor_alive(job_dir: str, state: NodeState | None) -> bool:
    return state is not None and procs.belongs(state.pid, job_dir)


def status(job_dir: str) -> dict[str, Any]:
    """The node's part of the job, as its supervisor last wrote it, with what only this look can add (JSON)."""
    state = node_state(job_dir)
    plan = read_json(Path(job_dir) / layout.PLAN_FILE) or {}
    paths = plan.get("paths") or {}
    info: dict[str, Any] = {
        "job_dir": job_dir, "job": plan.get("job"), "node": plan.get("node"),
        # Where this node keeps what the launcher collects (LOG.LOG_FILENAME and LOG.SAVE_DIR as the config says).
        "paths": {"log": str(Path(job_dir) / layout.LOG_FILE), "results": paths.get("results", []),
                  "checkpoints": paths.get("checkpoints"), "run_dir": paths.get("run_dir")},
    }
    if state is None:
        return {**info, "state": "none"}
    info.update({key: value for key, value in dump(state).items() if key != "updated"})
    if supervisor_alive(job_dir, state):
        info["state"] = "running"
        if state.mode == Mode.HUB:
            info["watch"] = read_json(Path(job_dir) / layout.WATCH_FILE)
    else:
        info["state"] = state.end.state.value if state.end is not None else "killed"
        info["log_tail"] = log_tail(job_dir)
    return info
