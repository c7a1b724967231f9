"""How a job heals itself on a local cluster: the time to detect each kind of failure, from detection to the first
training step of the next attempt, and the training lost.

    .venv/bin/python -m bench.restarts             (root: a 3-node local cluster, 2 trainers + 1 spare; ~10 minutes)
    .venv/bin/python -m bench --only restarts      (the same, as rows of the benchmark table)

One job per failure: a trainer killed (SIGKILL), a trainer frozen (SIGSTOP), a node lost (every process of its
network namespace killed, its sshd too), the rank-0 node lost (the job's hub with it), and SIGTERM to every supervisor
(a preemption: the trainers checkpoint at a common step). Heartbeat timeout 10 s, stop grace 10 s, a mid-epoch
checkpoint every CHECKPOINT_MINUTES (0.1: 6 s here, so that a lost stretch shows at this scale).

The figures are the job's own records: the hub's (trainer/runtime/hub.py: the cause, the time from the failed part's
last sign of life to the hub's decision) and the restarted rank 0's record in metrics.jsonl (trainer/reporting.py:
from that decision to the attempt's first optimizer step, and the steps between the last step rank 0 reported and the
step the attempt resumed from), the steps as seconds at the run's step time. Goals (issue 17): detection <= heartbeat
timeout + 5 s; training again within 60 s of detection; training lost <= CHECKPOINT_MINUTES.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.local import ENV, REPO, VENV_BIN, build, training_cluster
from trainer.runtime import procs
from trainer.runtime.contract import METRICS_FILE, STATUS_FILE

CLUSTER = "brestart"
HEARTBEAT_S = 10.0
CHECKPOINT_MINUTES = 0.1
LOCAL = ("-e", "nodes=3", "-e", "spares=1")


def home(node: int) -> Path:
    return REPO / ".local-cluster" / CLUSTER / "nodes" / str(node) / "home"


def job_dir(node: int, job: str) -> Path:
    """The node's folder of the job, as this machine sees it."""
    return home(node) / "vidcluster" / "jobs" / job / f"node{node}"


def run_file(node: int, job: str, name: str) -> Path:
    return home(node) / "vidcluster" / "jobs" / job / "run" / name


def read(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def trainer(job: str, node: int) -> int:
    """A training process of the job on the node (found by the environment every one of them carries)."""
    return min(procs.job_processes(f"/home/vctrain/vidcluster/jobs/{job}/node{node}", trainers_only=True))


def kill_node(node: int) -> None:
    out = subprocess.run(["ip", "netns", "pids", f"vc-{CLUSTER}-{node}"], capture_output=True, text=True).stdout
    for pid in out.split():
        os.kill(int(pid), signal.SIGKILL)


def preempt(job: str) -> None:
    for node in (0, 1):
        os.kill(read(job_dir(node, job) / "state.json")["pid"], signal.SIGTERM)


SCENARIOS: dict[str, tuple[Callable[[str], None], int]] = {  # the fault, and the node whose hub records it
    "a trainer killed (SIGKILL)": (lambda job: os.kill(trainer(job, 1), signal.SIGKILL), 0),
    "a trainer frozen (SIGSTOP)": (lambda job: os.kill(trainer(job, 0), signal.SIGSTOP), 0),
    "a node lost (every process)": (lambda job: kill_node(1), 0),
    "the rank-0 node lost (with the job's hub)": (lambda job: kill_node(0), 1),
    "SIGTERM to every supervisor (preemption)": (preempt, 0),
}


def measure(inventory: Path, name: str, index: int) -> dict[str, Any]:
    fault, hub = SCENARIOS[name]
    job = f"bench-restart-{index}"
    overrides = {"CONFIG": {"TRAIN": {"EPOCH_NUM": 40, "CHECKPOINT_MINUTES": CHECKPOINT_MINUTES}}}
    play = subprocess.Popen(
        [str(VENV_BIN / "ansible-playbook"), "-i", str(inventory), "launch-training.yml", "-e", "config=i3d_cpu_test",
         "-e", f"job_id={job}", "-e", "ddp_config_omp_num_threads=1", "-e", "ddp_config_stop_grace=10",
         "-e", f"ddp_config_heartbeat_timeout={HEARTBEAT_S}", "-e", "ddp_launch_poll_seconds=2",
         "-e", "ddp_launch_recheck_seconds=15", "-e", json.dumps({"ddp_config_overrides": overrides})],
        cwd=REPO, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    while read(run_file(0, job, STATUS_FILE)).get("epoch", 0) < 6:
        if play.poll() is not None:
            raise SystemExit(f"{job}: the launch ended (status {play.returncode}) before epoch 6")
        time.sleep(0.2)
    time.sleep(4)  # into the epoch, past its last mid-epoch checkpoint: some training to lose
    fault(job)
    play.wait(timeout=900)
    cause = read(job_dir(hub, job) / "state.json")["record"]["attempts"][1]["cause"]
    rank0 = 1 if hub == 1 else 0
    restarted = next(r for r in map(json.loads, run_file(rank0, job, METRICS_FILE).read_text().splitlines())
                     if r.get("attempt") == 1)
    step_s = read(run_file(rank0, job, STATUS_FILE)).get("step_time_s") or 0.0
    lost = restarted["steps_lost"]
    return {"scenario": name, "cause": f"{cause['node']} {cause['kind']}", "detect_s": cause["detect_s"],
            "restart_s": restarted["restart_s"], "lost_steps": lost,
            "lost_s": None if lost is None else round(lost * step_s, 1),
            "finished": read(run_file(rank0, job, STATUS_FILE)).get("state") == "finished"}


def run() -> list[dict[str, Any]]:
    results = []
    with training_cluster(CLUSTER, 3, "-e", "spares=1") as inventory:
        for index, name in enumerate(SCENARIOS):
            build(CLUSTER, 3, "-e", "spares=1")  # a node a scenario killed comes back for the next one
            results.append(measure(inventory, name, index))
            print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    return results


def goals(row: dict[str, Any]) -> tuple[bool, bool, bool]:
    """(detected in time, training again in time, little enough lost)."""
    lost = row["lost_s"]
    return (row["detect_s"] <= HEARTBEAT_S + 5, row["restart_s"] <= 60,
            lost is not None and lost <= CHECKPOINT_MINUTES * 60)


def main() -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    rows = run()
    print("| failure | cause on record | detected, s | training again after, s | lost, steps (s) | finished |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['scenario']} | {row['cause']} | {row['detect_s']} | {row['restart_s']} | {row['lost_steps']} "
              f"({row['lost_s']}) | {'yes' if row['finished'] else 'no'} |")
    return 0 if all(all(goals(row)) and row["finished"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
