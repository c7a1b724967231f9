"""``python -m trainer.runtime VERB JOB_DIR ...``: the node's verbs for its part of a job (standard library only).

    start JOB_DIR [--hub ADDR] [--rejoin]
                                   start the node's supervisor detached (its own session); print its pid and where its
                                   watch listens. The first member starts without --hub: it is the job's hub. With
                                   --rejoin, a member whose supervisor died (its machine rebooted) comes back into the
                                   running job: it starts no trainer until the hub's record gives it a rank.
    status JOB_DIR                 print the node's state of the job (trainer.runtime.host.nodestate.status)
    wait JOB_DIR SECONDS [--since KEY]
                                   the state once the job's progress (trainer.runtime.report.progress_key) differs
                                   from KEY, the job ended, or SECONDS passed
    stop JOB_DIR [--grace S] [--by WHO] [--reason WHY]
                                   stop the job here: the trainer checkpoints at a common step, SIGKILL after the
                                   plan's stop grace (or S seconds); idempotent
    keep-secret JOB_DIR            the launch's key for the job's watch, read from stdin, into the job folder's secret
                                   file: created readable by its owner alone (0600), never in another mode for a moment
    supervise JOB_DIR [--hub ADDR] [--rejoin]
                                   (what start runs)
    slurm-VERB LOGIN_JOB_DIR ...   a job on a Slurm site: trainer.runtime.slurm.allocation

Every verb but supervise prints one JSON object. The launcher reaches them through trainer.runtime.layout's entry
point, which finds JOB_DIR and the job's code version on the node.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from trainer.runtime import layout, report
from trainer.runtime.contract import JOB_DIR_ENV
from trainer.runtime.host import nodestate, procs
from trainer.runtime.plan import NodePlan, PlanError


def start(job_dir: str, hub: str | None, rejoin: bool) -> dict[str, Any]:
    current = nodestate.node_state(job_dir)
    if current is not None and nodestate.supervisor_alive(job_dir, current):
        raise SystemExit(f"error: job {Path(job_dir).parent.name} already runs on this node (pid {current.pid}); "
                         "stop it first")
    argv = [sys.executable, *layout.RUNTIME_FLAGS, "-m", "trainer.runtime", "supervise", job_dir,
            *(["--hub", hub] if hub else []), *(["--rejoin"] if rejoin else [])]
    env = {**os.environ, JOB_DIR_ENV: job_dir}
    with (Path(job_dir) / layout.LOG_FILE).open("ab") as log:
        # A new session: the job outlives the SSH connection that started it.
        proc = subprocess.Popen(argv, cwd=job_dir, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)
    deadline = time.monotonic() + 30
    while True:
        ended = proc.poll()
        # Read after the poll: a supervisor whose job was over by the next look (a one-node job of a moment) has
        # written its state, and started.
        state = nodestate.node_state(job_dir)
        if state is not None and state.pid == proc.pid and state.addr:
            return {"pid": proc.pid, "addr": state.addr, "mode": state.mode.value,
                    "state": "running" if ended is None else "ended"}
        if ended is not None or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    tail = "; ".join(nodestate.log_tail(job_dir, 5))
    raise SystemExit(f"error: the supervisor did not start (exit status {proc.poll()}): {tail}")


def wait(job_dir: str, seconds: float, since: str) -> dict[str, Any]:
    deadline = time.monotonic() + seconds
    while True:
        current = nodestate.status(job_dir)
        if current["state"] != "running" or report.progress_key(current) != since or time.monotonic() >= deadline:
            return current
        time.sleep(1.0)


def stop(job_dir: str, grace: float, by: str, reason: str) -> dict[str, Any]:
    state = nodestate.node_state(job_dir)
    if not nodestate.supervisor_alive(job_dir, state) and not procs.job_processes(job_dir):
        return {"changed": False, **nodestate.status(job_dir)}
    if state is not None and procs.belongs(state.pid, job_dir):
        pid = state.pid
        nodestate.request_stop(job_dir, pid, by, reason)
        procs.signal_all([pid], signal.SIGTERM)  # the supervisor tells its trainer to checkpoint and stop, then ends
        deadline = time.monotonic() + grace + 10
        while procs.belongs(pid, job_dir) and time.monotonic() < deadline:
            time.sleep(0.2)
    left = procs.end(job_dir, 2.0)  # whatever is left of the job here (a supervisor that did not end in time)
    return {"changed": True, "left": left, **nodestate.status(job_dir)}


def planned_grace(job_dir: str) -> float:
    """The plan's stop grace; a plan this runtime cannot read gives its trainers none (they are killed at once)."""
    try:
        return NodePlan.read(str(Path(job_dir) / layout.PLAN_FILE)).watch.stop_grace
    except PlanError:
        return 0.0


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m trainer.runtime", description="a node's part of a training job")
    verbs = parser.add_subparsers(dest="verb", required=True)
    for name in ("start", "supervise"):
        sub = verbs.add_parser(name)
        sub.add_argument("job_dir")
        sub.add_argument("--hub", default=None, help="where the job's hub listens (host:port); none: be the hub")
        sub.add_argument("--rejoin", action="store_true",
                         help="come back into the running job at --hub: no trainer until its record gives a rank")
    verbs.add_parser("status").add_argument("job_dir")
    verbs.add_parser("keep-secret").add_argument("job_dir")
    sub = verbs.add_parser("wait")
    sub.add_argument("job_dir")
    sub.add_argument("seconds", type=float)
    sub.add_argument("--since", default="", help="the progress key last seen; return as soon as it changes")
    sub = verbs.add_parser("stop")
    sub.add_argument("job_dir")
    sub.add_argument("--grace", type=float, default=None, help="seconds before SIGKILL (default: the plan's)")
    sub.add_argument("--by", default="user")
    sub.add_argument("--reason", default="stop-training.yml")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] and argv[0].startswith("slurm-"):  # a job inside a Slurm allocation, and the login host's verbs
        from trainer.runtime.slurm import allocation as slurm

        return slurm.main(argv)
    args = get_args_parser().parse_args(argv)
    job_dir = os.path.realpath(os.path.expanduser(args.job_dir))
    if args.verb in ("start", "supervise") and args.rejoin and not args.hub:
        raise SystemExit("error: --rejoin needs --hub (the running job's hub)")
    if args.verb == "supervise":
        from trainer.runtime.watch.supervisor import main as supervise

        return supervise(job_dir, args.hub, args.rejoin)
    if args.verb == "start":
        result = start(job_dir, args.hub, args.rejoin)
    elif args.verb == "status":
        result = nodestate.status(job_dir)
    elif args.verb == "wait":
        result = wait(job_dir, args.seconds, args.since)
    elif args.verb == "keep-secret":
        result = nodestate.keep_secret(job_dir, sys.stdin.buffer.read().strip())
    else:
        result = stop(job_dir, args.grace if args.grace is not None else planned_grace(job_dir), args.by, args.reason)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
