"""Where a job's files are on a node, and what each one holds: the one answer to "where is X?".

Standard library only, and self-contained: the trainer's renderer imports it on the controller (with each node's
home), and the launcher runs this very file on the nodes as the runtime's entry point (see ``main``), where "~" is
the node's own home.

A job's files on a node are in ``job_dir(jobs_dir, job, node)`` = ``<jobs_dir>/<job id>/<node name>/``, so nodes
that share a home directory never share a file. Each file has one writer:

    plan.json        the launch      the node plan (trainer.runtime.plan): argv, environment, members, every path
    secret           the launch      this launch's key for the job's watch (0600, never logged)
    config.yaml      the launch      the node's trainer config (python -m trainer.node_config)
    train.log        the supervisor  its own lines and its trainer's output, every attempt
    state.json       the supervisor  the node's state: its trainer, the attempt, the job record it last heard
    watch.json       the hub         every member as the job's hub sees it (only on the node that hosts the hub)
    stop.request     the stop verb   a user's stop (stop-training.yml)
    heartbeat/<pid>  each trainer    the process's liveness (trainer/heartbeat.py)
    channel/         the supervisor  the channel to its trainers (trainer.runtime.host.channel), made 0700:
      <pid>.json     each trainer    the process's attempt, state and phases (trainer/timeline.py)
      next-attempt.json  the supervisor  the attempt that is over, and the next one to join in place
    weights-table.json  the launch   the site's table of weights (VIDCLUSTER_WEIGHTS_TABLE), when there is one
    trainer-code.tar.gz  the launch  a code version on its way into <code_root>/<version> (deleted once unpacked)

On a Slurm site the login host has a folder of the job too, with the job's Slurm files (trainer.runtime.slurm.account).

The trainer writes the run directory (the config's LOG.BASE_PATH/EXP_NAME; its files are named in
trainer.runtime.contract) and the checkpoints (LOG.SAVE_DIR). The trainer code lives in
``code_dir(code_root, version)``/trainer, one folder per version.

On a node, the launcher runs ``python3 -I -c "<this file>" VERB --jobs-dir DIR --job JOB --node NODE [ARGS...]``: this
finds the job's folder, reads its plan, and runs ``python -m trainer.runtime VERB JOB_DIR ARGS...`` with the plan's
Python and the job's own code version. Without ``--job`` the verb runs for every job of the node (one JSON line
each); a job without a plan here prints ``{"state": "none"}``.
"""

from __future__ import annotations

import json
import os
import posixpath
import subprocess
import sys

PLAN_FILE = "plan.json"
SECRET_FILE = "secret"
CONFIG_FILE = "config.yaml"
LOG_FILE = "train.log"
STATE_FILE = "state.json"
WATCH_FILE = "watch.json"
STOP_REQUEST_FILE = "stop.request"
HEARTBEAT_DIR = "heartbeat"
CHANNEL_DIR = "channel"
SITE_WEIGHTS_TABLE = "weights-table.json"
CODE_ARCHIVE = "trainer-code.tar.gz"  # a code version on its way to the node (unpacked, then deleted)
DESCRIPTION_FILE = "launch.json"  # the job description the plans were rendered from (trainer.node_config)

DEFAULT_JOBS_DIR = "~/vidcluster/jobs"
DEFAULT_CODE_ROOT = "~/vidcluster/code"
DEFAULT_ENV_PATH = "~/vidcluster/venv"  # the training environment on every node (vidcluster_env_path)
# How every Python process of a job starts (the runtime's verbs, its supervisor, the trainer): never with the working
# directory (an SSH login's home) first on sys.path, where a stray ~/trainer/ would run instead of the job's code.
SAFE_PATH = ("-P",)
# The runtime (standard library only) also without site: no sitecustomize.py, no .pth file runs in its verbs, which
# run before the launcher has checked the node's copy of the code (its folder is their PYTHONPATH).
RUNTIME_FLAGS = (*SAFE_PATH, "-S")
# A job id names folders on every node: no separators, no leading dot, nothing a shell or a path would read.
JOB_ID_CHARS = "letters, digits, '.', '_' and '-', starting with a letter or digit, at most 64"


def valid_job_id(job: str) -> bool:
    """A job id that names one folder and nothing else (``JOB_ID_CHARS``)."""
    return (0 < len(job) <= 64 and job[0].isascii() and job[0].isalnum()
            and all(c.isascii() and (c.isalnum() or c in "._-") for c in job))


def url_host(address: str) -> str:
    """An IP address as the host part of a URL or of ``host:port`` (IPv6 in brackets)."""
    return f"[{address}]" if ":" in address else address


def node_path(path: str, home: str) -> str:
    """A path as the node sees it: "~" and relative paths are in the node user's home, absolute ones stay."""
    if path == "~" or path.startswith("~/"):
        return posixpath.normpath(home + path[1:])
    if posixpath.isabs(path):
        return posixpath.normpath(path)
    return posixpath.normpath(posixpath.join(home, path))


def job_dir(jobs_dir: str, job: str, node: str, home: str) -> str:
    """The node's own folder of a job."""
    if not valid_job_id(job):
        raise ValueError(f"job id {job!r}: use {JOB_ID_CHARS}")
    return posixpath.join(node_path(jobs_dir, home), job, node)


def code_dir(code_root: str, version: str, home: str) -> str:
    """The folder of one trainer code version on a node (it holds the package ``trainer``)."""
    return posixpath.join(node_path(code_root, home), version)


def env_python(env_path: str, home: str) -> str:
    """The training environment's Python on a node."""
    return posixpath.join(node_path(env_path, home), "bin", "python")


# ---------------------------------------------------------------------------------------------------------------------
# The entry point on a node (run as ``python3 -c "<this file>" ...``; no other module of the runtime is importable yet)


def _plan(folder: str) -> dict | None:
    try:
        with open(os.path.join(folder, PLAN_FILE)) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def _run(verb: str, folder: str, rest: list[str], replace: bool) -> int:
    plan = _plan(folder)
    if plan is None:
        print(json.dumps({"job_dir": folder, "state": "none"}), flush=True)
        return 0
    argv = [plan["paths"]["env_python"], *RUNTIME_FLAGS, "-m", "trainer.runtime", verb, folder, *rest]
    env = {**os.environ, "PYTHONPATH": plan["paths"]["code_dir"]}
    if replace:
        os.execve(argv[0], argv, env)
    return subprocess.run(argv, env=env, check=False).returncode


def main(argv: list[str]) -> int:
    """``VERB --jobs-dir DIR [--job JOB] --node NODE [ARGS...]`` (see the module docstring)."""
    if len(argv) < 5 or argv[1] != "--jobs-dir":
        print("usage: VERB --jobs-dir DIR [--job JOB] --node NODE [ARGS...]", file=sys.stderr)
        return 2
    verb, jobs_dir, rest = argv[0], argv[2], argv[3:]
    job = rest[1] if rest[0] == "--job" else ""
    rest = rest[2:] if rest[0] == "--job" else rest
    if rest[:1] != ["--node"] or len(rest) < 2:
        print("the entry point needs --node NODE", file=sys.stderr)
        return 2
    node, rest = rest[1], rest[2:]
    home = os.path.expanduser("~")
    if job:
        return _run(verb, job_dir(jobs_dir, job, node, home), rest, replace=True)
    root = node_path(jobs_dir, home)
    names = sorted(os.listdir(root)) if os.path.isdir(root) else []
    folders = [os.path.join(root, name, node) for name in names if valid_job_id(name)]
    codes = [_run(verb, folder, rest, replace=False) for folder in folders if _plan(folder) is not None]
    return max(codes, default=0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
