"""Start, watch and stop one training job's process group on this node (standard library only).

roles/ddp_launch copies this file into the job folder and runs it with the node's system Python:

    jobctl.py start JOB_DIR                   start the trainer detached (new session), pid in JOB_DIR/train.pid
    jobctl.py wait-port JOB_DIR HOST PORT T   until HOST:PORT accepts connections; fail early if the job died
    jobctl.py wait JOB_DIR SECONDS [STATUS]   until the job ends or SECONDS pass; print its state (+ STATUS json)
    jobctl.py status JOB_DIR [STATUS]         print the job's state
    jobctl.py stop JOB_DIR GRACE              SIGTERM the job's process group, SIGKILL after GRACE s (idempotent)

JOB_DIR/job.json (rendered by the role) says what to run: {"argv": [...], "env": {...}, "cwd": "...",
"workers": N}. The job's processes form one process group whose leader is a `supervise` process of this file:
it runs the trainer, then writes the trainer's exit status to JOB_DIR/train.exit. Every process of the job
carries VIDCLUSTER_JOB_DIR in its environment, which is how a pid is known to still be ours.

States: none (never started here), running, finished (exit 0), failed (non-zero exit), killed (ended without
an exit status: a signal took the whole group), stopped (by `stop`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

JOB_ENV = "VIDCLUSTER_JOB_DIR"
PID_FILE, LOG_FILE, EXIT_FILE = "train.pid", "train.log", "train.exit"
STOP_FILE, SPEC_FILE = "train.stopped", "job.json"
TAIL_LINES = 25


def job_dir(arg: str) -> Path:
    return Path(os.path.expanduser(arg)).resolve()


def group_members(job: Path, pgid: int) -> list[int]:
    """Live processes of process group ``pgid`` that belong to this job (a reused pid belongs to someone else)."""
    marker = f"{JOB_ENV}={job}".encode()
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            # Fields after the command name (which may hold spaces): state ppid pgrp ...
            fields = stat[stat.rindex(")") + 2 :].split()
            if int(fields[2]) != pgid or fields[0] == "Z":
                continue
            if marker in (entry / "environ").read_bytes().split(b"\0"):
                members.append(int(entry.name))
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile, or not ours to read
    return members


def read_pid(job: Path) -> int | None:
    try:
        return int((job / PID_FILE).read_text().strip())
    except (OSError, ValueError):
        return None


def log_tail(job: Path, lines: int = TAIL_LINES) -> list[str]:
    try:
        with (job / LOG_FILE).open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 64 * 1024))
            text = handle.read().decode(errors="replace")
    except OSError:
        return []
    # The progress bar rewrites its line with carriage returns; keep what the last rewrite shows.
    return [line.rsplit("\r", 1)[-1] for line in text.splitlines()[-lines:]]


def state(job: Path, status_file: str = "") -> dict[str, Any]:
    """The job's state on this node, plus the trainer's status file when given (rank 0)."""
    pid = read_pid(job)
    info: dict[str, Any] = {"job_dir": str(job), "pid": pid, "rc": None}
    if pid is None:
        info["state"] = "none"
    elif group_members(job, pid):
        info["state"] = "running"
    else:
        try:
            ended = json.loads((job / EXIT_FILE).read_text())
            info["rc"], info["ended"] = ended["rc"], ended["ended"]
        except (OSError, ValueError, KeyError):
            info["rc"] = None
        if (job / STOP_FILE).exists():
            info["state"] = "stopped"
        elif info["rc"] is None:
            info["state"] = "killed"
        else:
            info["state"] = "finished" if info["rc"] == 0 else "failed"
    if info["state"] not in ("none", "running"):
        info["log_tail"] = log_tail(job)
    if status_file:
        try:
            info["status"] = json.loads(Path(os.path.expanduser(status_file)).read_text())
        except (OSError, ValueError):
            info["status"] = None
    return info


def start(job: Path) -> dict[str, Any]:
    current = state(job)
    if current["state"] == "running":
        raise SystemExit(f"job {job.name} is already running on this node (pid {current['pid']}); stop it first")
    for name in (EXIT_FILE, STOP_FILE):
        (job / name).unlink(missing_ok=True)
    env = {**os.environ, JOB_ENV: str(job)}
    with (job / LOG_FILE).open("ab") as log:
        # A new session: the job outlives the SSH connection and its process group is its own.
        proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "supervise", str(job)],
            cwd=job, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True, close_fds=True,
        )  # fmt: skip
    (job / PID_FILE).write_text(f"{proc.pid}\n")
    return {"pid": proc.pid, "state": "running", "log": str(job / LOG_FILE)}


def supervise(job: Path) -> None:
    spec = json.loads((job / SPEC_FILE).read_text())
    env = {**os.environ, **{k: str(v) for k, v in spec["env"].items()}, JOB_ENV: str(job)}
    if int(env.get("OMP_NUM_THREADS", "0") or 0) <= 0:
        # Share the node's cores between its workers instead of every worker taking all of them.
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // max(1, int(spec.get("workers", 1)))))
    argv = [os.path.expanduser(spec["argv"][0]), *spec["argv"][1:]]
    print(f"jobctl: starting {' '.join(argv)} in {spec['cwd']} at {time.strftime('%F %T')}", flush=True)
    try:
        rc = subprocess.call(argv, cwd=spec["cwd"], env=env)
    except OSError as exc:
        print(f"jobctl: cannot start the trainer: {exc}", flush=True)
        rc = 127
    tmp = job / f".{EXIT_FILE}.tmp"
    tmp.write_text(json.dumps({"rc": rc, "ended": time.time()}))
    os.replace(tmp, job / EXIT_FILE)
    print(f"jobctl: trainer exited with status {rc} at {time.strftime('%F %T')}", flush=True)


def wait(job: Path, seconds: float, status_file: str = "") -> dict[str, Any]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and state(job)["state"] == "running":
        time.sleep(1.0)
    return state(job, status_file)


def wait_port(job: Path, host: str, port: int, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, port), timeout=2):
                return {"listening": True, **state(job)}
        except OSError:
            pass
        current = state(job)
        if current["state"] != "running" or time.monotonic() > deadline:
            return {"listening": False, **current}
        time.sleep(1.0)


def stop(job: Path, grace: float) -> dict[str, Any]:
    pid = read_pid(job)
    if pid is None or not group_members(job, pid):
        return {"changed": False, **state(job)}
    (job / STOP_FILE).write_text(f"{time.time()}\n")
    for sig, wait_s in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        for member in group_members(job, pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(member, sig)
        deadline = time.monotonic() + wait_s
        while group_members(job, pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if not group_members(job, pid):
            break
    left = group_members(job, pid)
    return {"changed": True, "left": left, **state(job)}


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    command, job = argv[0], job_dir(argv[1])
    rest = argv[2:]
    if command == "supervise":
        supervise(job)
        return 0
    if command == "start":
        result = start(job)
    elif command == "wait":
        result = wait(job, float(rest[0]), rest[1] if len(rest) > 1 else "")
    elif command == "wait-port":
        result = wait_port(job, rest[0], int(rest[1]), float(rest[2]))
    elif command == "status":
        result = state(job, rest[0] if rest else "")
    elif command == "stop":
        result = stop(job, float(rest[0]) if rest else 15.0)
    else:
        print(__doc__, file=sys.stderr)
        return 2
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
