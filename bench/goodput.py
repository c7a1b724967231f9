"""Goodput at length: one long job on a 3-node local cluster with no spare, faults on a timetable (issue 37).

    .venv/bin/python -m bench.goodput [--minutes 40]      (root; the job's minutes plus about 5 for the cluster)

The job: r3d_18 on 56 px clips (bench/restarts.py's) on a larger synthetic dataset (TRAIN_PER_CLASS videos per
class, so an epoch's end and its evaluation are a small part of it), one trainer per node, vidcluster_min_nodes 2, the
heartbeat timeout and stop grace HEARTBEAT_S (as bench/restarts.py --faults), a mid-epoch checkpoint every
CHECKPOINT_MINUTES, MAX_RESTARTS restarts allowed.
The faults, at fractions of the job's length (at 40 minutes: a trainer killed every 10 minutes, node2 lost at 15):
  - at 1/4, 1/2 and 3/4: a trainer SIGKILLed (node1's, node2's, node1's): restart in place;
  - at 3/8: node2's machine hangs (every process of its namespace stopped) until the hub has shrunk the world to
    node0 and node1, then THAWED_AFTER_S more; then it answers again and rejoins the running job (the grow).
At the end the bench stops the job as a person would (stop-training.yml: a checkpoint at a common step) and prints
the job's goodput from its own record (trainer/runtime/job/goodput.py: start-up included), part by part.
Goal: at least GOAL of the wall time trained.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.local import ENV, REPO, VENV_BIN, playbook, signal_node, training_cluster
from bench.restarts import GOODPUT_PARTS, JOB, job_dir, job_record, read, run_file
from trainer.node_config import merge
from trainer.runtime.contract import STATUS_FILE
from trainer.runtime.job.record import JobRecord

CLUSTER = "bgood"
NODES = 3
HEARTBEAT_S = 10.0
CHECKPOINT_MINUTES = 2.0
TRAIN_PER_CLASS = 200
DATA = "data/goodput"
THAWED_AFTER_S = 30.0
MAX_RESTARTS = 8  # the timetable's 4 failures (a grow is no failure); the shipped 3 would end the job at the last kill
GOAL = 0.95


def job_overrides() -> dict[str, object]:
    """bench/restarts.py's job (r3d_18 on 56 px clips: its steps compute-bound, as a real job's are, where i3d_tiny's
    wait for decoding on this machine's shared cores) on the larger dataset, for as long as the bench lets it run."""
    home = "~/" + DATA
    return merge(JOB, {"CONFIG": {"TRAIN": {"EPOCH_NUM": 100000, "CHECKPOINT_MINUTES": CHECKPOINT_MINUTES},
                                  "VAL": {"FREQ": 10},
                                  "DATA": {"TRAIN_ANNO_PATH": f"{home}/train.txt", "TRAIN_DATA_PATH": home,
                                           "VAL_ANNO_PATH": f"{home}/val.txt", "VAL_DATA_PATH": home}}})


def stage_dataset(inventory: Path) -> None:
    """The larger dataset, made here and staged to every node."""
    with tempfile.TemporaryDirectory(prefix="bench-goodput-") as tmp:
        data = Path(tmp) / "goodput"
        subprocess.run([str(VENV_BIN / "python"), "-m", "trainer", "make-dataset", str(data), "--classes", "left",
                        "right", "--train-per-class", str(TRAIN_PER_CLASS), "--val-per-class", "6"],
                       cwd=REPO, check=True, capture_output=True)  # fmt: skip
        playbook("-i", str(inventory), "playbooks/stage-data.yml", "-e", f"src={data}", "-e", f"dest={DATA}")


def record(job: str) -> JobRecord:
    return job_record(0, job, CLUSTER)


def kill_trainer(job: str, node: int) -> None:
    os.kill(int(read(job_dir(node, job, CLUSTER) / "state.json")["trainer"]["pid"]), signal.SIGKILL)
    say(f"node{node}'s trainer killed")


def hang_node(job: str, node: int) -> None:
    """Every process of the node's namespace stopped until the world has shrunk, then THAWED_AFTER_S more."""
    changes = len(record(job).world_changes)
    signal_node(CLUSTER, node, signal.SIGSTOP)
    say(f"node{node} hangs")
    try:
        deadline = time.monotonic() + 300
        while len(record(job).world_changes) == changes:
            if time.monotonic() > deadline:
                raise SystemExit("the world did not shrink within 300 s of node2 hanging")
            time.sleep(0.5)
        say("the world shrank")
        time.sleep(THAWED_AFTER_S)
    finally:
        signal_node(CLUSTER, node, signal.SIGCONT)
    say(f"node{node} answers again")


def timetable(job: str, minutes: float) -> list[tuple[float, Callable[[], None]]]:
    """(seconds after the first step, the fault)."""
    length = minutes * 60
    return [(length / 4, lambda: kill_trainer(job, 1)), (3 * length / 8, lambda: hang_node(job, 2)),
            (length / 2, lambda: kill_trainer(job, 2)), (3 * length / 4, lambda: kill_trainer(job, 1))]


def say(line: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} goodput bench: {line}", file=sys.stderr, flush=True)


def run_job(inventory: Path, minutes: float) -> JobRecord:
    job = f"bench-goodput-{os.getpid()}"
    play = subprocess.Popen(
        [str(VENV_BIN / "ansible-playbook"), "-i", str(inventory), "launch-training.yml", "-e", "config=i3d_cpu_test",
         "-e", f"job_id={job}", "-e", "vidcluster_min_nodes=2", "-e", f"max_restarts={MAX_RESTARTS}",
         "-e", "ddp_config_omp_num_threads=1",
         "-e", f"ddp_config_heartbeat_timeout={HEARTBEAT_S}", "-e", f"ddp_config_stop_grace={HEARTBEAT_S}",
         "-e", "ddp_launch_poll_seconds=5", "-e", json.dumps({"ddp_config_overrides": job_overrides()})],
        cwd=REPO, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        while read(run_file(0, job, STATUS_FILE, CLUSTER)).get("state") != "running":
            if play.poll() is not None:
                raise SystemExit(f"{job}: the launch ended (status {play.returncode}) before the job trained")
            time.sleep(1)
        started = time.monotonic()
        say(f"{job} trains")
        for at, fault in timetable(job, minutes):
            time.sleep(max(0.0, started + at - time.monotonic()))
            fault()
        time.sleep(max(0.0, started + minutes * 60 - time.monotonic()))
        # as a person would: every node's trainer checkpoints at a common step and exits
        playbook("-i", str(inventory), "stop-training.yml", "-e", f"job_id={job}")
        say("stopped")
        play.wait(timeout=600)
    finally:
        if play.poll() is None:
            play.kill()
        signal_node(CLUSTER, 2, signal.SIGCONT)
    return record(job)


def report(found: JobRecord) -> str:
    spent = found.goodput
    if spent is None:
        return "no goodput on record"
    parts = [getattr(spent, f"{part}_s") for part in GOODPUT_PARTS]
    changes = "; ".join(f"{c.cause} {'+'.join(c.left or c.joined)} {c.before}->{c.after}" for c in found.world_changes)
    return "\n".join([
        "| restarts | world changes | wall, s | " + " | ".join(f"{part}, s" for part in GOODPUT_PARTS)
        + " | goodput |", "|---" * (4 + len(GOODPUT_PARTS)) + "|",
        f"| {found.restarts} | {changes} | {spent.wall_s:.0f} | " + " | ".join(f"{part:.1f}" for part in parts)
        + f" | {spent.trained_s / spent.wall_s:.1%} |"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=40.0, help="the job's length, from its first step")
    args = parser.parse_args()
    start, load = time.perf_counter(), os.getloadavg()[0]
    with training_cluster(CLUSTER, NODES) as inventory:
        stage_dataset(inventory)
        found = run_job(inventory, args.minutes)
    print(report(found))
    print(f"\n{os.cpu_count()} CPU cores, load average {load:.1f} before, {os.getloadavg()[0]:.1f} after, "
          f"{time.perf_counter() - start:.0f} s")
    return 0 if found.goodput is not None and found.goodput.trained_s >= GOAL * found.goodput.wall_s else 1


if __name__ == "__main__":
    sys.exit(main())
