"""A job on a Slurm site heals itself in its allocation, or Slurm requeues it: how long each takes, side by side in
one run on one local Slurm cluster (playbooks/local-cluster.yml -e slurm=true: 4 compute nodes and a login host).

    .venv/bin/python -m bench.slurm                (root; about 8 minutes)

One job per failure, each launched with launch-training.yml from the login host (2 trainers, gloo, heartbeat timeout
10 s, a mid-epoch checkpoint every 6 s), the fault once rank 0 is past epoch 6:
    a trainer killed (SIGKILL)                  restarted in the same allocation
    a node lost, a spare in the allocation      the spare takes its rank, in the same allocation
    a node lost, no spare                       the step ends, Slurm requeues the job, it resumes on other nodes
    the time limit (1 minute, signal at 10 s)   every rank checkpoints at one step, Slurm requeues the job (then
                                                the limit is lifted: one requeue is what is measured)
The figures are the job's own records: the cause's detection time (from the failed part's last sign of life to the
hub's decision; the time limit's signal is its own detection), the restarted rank 0's record in metrics.jsonl (from
that decision to the next attempt's first optimizer step, and the steps trained again), and Slurm's completion log
(how many runs the job took). A requeued job waits the cluster's requeue delay before it may start again: 10 s here
(AuthInfo cred_expire), Slurm's default is 120 s, and on a busy site it then waits in the queue.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bench.local import ENV, NEEDS_ROOT, REPO, VENV_BIN, inventory, playbook
from trainer.runtime.host import procs

CLUSTER = "bslurm"
COMPUTE = 4
STATE = REPO / ".local-cluster" / CLUSTER
HOME = STATE / "shared-home"
JOBS = HOME / "vidcluster" / "jobs"
FAULT_EPOCH = 6


@contextlib.contextmanager
def slurm_cluster() -> Iterator[Path]:
    """The local Slurm cluster, set up, with the small dataset in its shared home; removed afterwards whatever
    happens. Yields its inventory."""
    if os.geteuid() != 0:
        raise RuntimeError(NEEDS_ROOT)
    playbook("playbooks/local-cluster.yml", "-e", f"nodes={COMPUTE}", "-e", f"cluster_name={CLUSTER}", "-e",
             "slurm=true")
    try:
        playbook("-i", str(inventory(CLUSTER)), "setup-cluster.yml")
        data = HOME / "data" / "vidcluster-test"
        subprocess.run([str(VENV_BIN / "python"), "-m", "trainer", "make-dataset", str(data), "--classes", "left",
                        "right"], cwd=REPO, check=True, capture_output=True)  # fmt: skip
        for path in [data.parent, data, *data.rglob("*")]:
            shutil.chown(path, "vctrain", "vctrain")
        yield inventory(CLUSTER)
    finally:
        playbook("playbooks/local-cluster.yml", "-e", f"cluster_name={CLUSTER}", "-e", "state=absent", check=False)


def read(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def members(job: str) -> list[str]:
    """The nodes of the job's current allocation, rank 0 (the batch host) first."""
    return (read(JOBS / job / "login" / "slurm.json").get("allocations") or [{}])[-1].get("members", [])


def requeued(job: str) -> bool:
    """Has the batch step had Slurm requeue the job (it may have started again already)?"""
    account = read(JOBS / job / "login" / "slurm.json")
    return bool(account.get("next")) or len(account.get("allocations") or []) > 1


def kill_trainer(job: str) -> None:
    node = members(job)[1]
    os.kill(min(procs.job_processes(f"/home/vctrain/vidcluster/jobs/{job}/{node}", trainers_only=True)),
            signal.SIGKILL)


def lose_node(job: str) -> None:
    """Every process of rank 1's node (its slurmd too); it stays lost. Once Slurm sees it not responding, the next job
    is not given it."""
    name = members(job)[1]
    for pid in subprocess.run(["ip", "netns", "pids", f"vc-{CLUSTER}-{name.removeprefix('node')}"],
                              capture_output=True, text=True).stdout.split():
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)
    sinfo = ["sinfo", "--noheader", f"--nodes={name}", "--format=%t"]
    conf = {**ENV, "SLURM_CONF": str(STATE / "slurm" / "etc" / "slurm.conf")}
    while not subprocess.run(sinfo, env=conf, capture_output=True, text=True).stdout.strip().endswith("*"):
        time.sleep(2)  # not responding: Slurm gives it no job from now on


SCENARIOS: dict[str, tuple[Callable[[str], None] | None, tuple[str, ...]]] = {  # the fault, more -e settings
    "a trainer killed (SIGKILL)": (kill_trainer, ()),
    "a node lost, a spare in the allocation": (lose_node, ("-e", "vidcluster_slurm_spares=1")),
    "a node lost, no spare": (lose_node, ()),
    "the time limit (1 minute, signal at 10 s)": (None, ("-e", "vidcluster_slurm_time=1",
                                                        "-e", "vidcluster_slurm_signal_seconds=10")),
}


def measure(inventory: Path, name: str, index: int, epochs: int) -> dict[str, Any]:
    fault, extra = SCENARIOS[name]
    job = f"bench-slurm-{index}"
    overrides = {"CONFIG": {"TRAIN": {"EPOCH_NUM": epochs, "CHECKPOINT_MINUTES": 0.1}}}
    play = subprocess.Popen(
        [str(VENV_BIN / "ansible-playbook"), "-i", str(inventory), "launch-training.yml", "-e", "config=i3d_cpu_test",
         "-e", f"job_id={job}", "-e", "ddp_config_omp_num_threads=1", "-e", "ddp_config_stop_grace=10",
         "-e", "ddp_config_heartbeat_timeout=10", "-e", "ddp_launch_poll_seconds=2",
         "-e", "ddp_launch_recheck_seconds=15", "-e", json.dumps({"ddp_config_overrides": overrides}), *extra],
        cwd=REPO, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    status = JOBS / job / "run" / "status.json"
    while read(status).get("epoch", 0) < 1:
        time.sleep(0.2)
    started = time.monotonic()
    while read(status).get("epoch", 0) < FAULT_EPOCH:
        if play.poll() is not None:
            raise SystemExit(f"{job}: the launch ended (status {play.returncode}) before epoch {FAULT_EPOCH}")
        time.sleep(0.2)
    epoch_s = (time.monotonic() - started) / (FAULT_EPOCH - 1)
    if fault is not None:
        time.sleep(2)  # into the epoch, past its last mid-epoch checkpoint: some training to lose
        fault(job)
    else:  # the time limit: once it requeued the job, the administrator lifts it (one requeue is what is measured)
        while not requeued(job):
            if play.poll() is not None:
                raise SystemExit(f"{job}: the job ended before its time limit")
            time.sleep(0.5)
        slurm_job = read(JOBS / job / "login" / "slurm.json")["slurm_job"]
        subprocess.run(["scontrol", "update", f"JobId={slurm_job}", "TimeLimit=UNLIMITED"], check=True,
                       env={**ENV, "SLURM_CONF": str(STATE / "slurm" / "etc" / "slurm.conf")})
    play.wait(timeout=1200)
    lines = (JOBS / job / "run" / "metrics.jsonl").read_text().splitlines()
    record = next((r for r in map(json.loads, lines) if r.get("attempt") == 1), {})
    account = read(JOBS / job / "login" / "slurm.json")
    runs = [line for line in (STATE / "slurm" / "jobcomp.log").read_text().splitlines()  # RESIZING: not a run
            if line.startswith(f"JobId={account['slurm_job']} ") and " JobState=RESIZING " not in line]
    return {"scenario": name, "cause": f"{record.get('node')} {record.get('cause')}",
            "detect_s": record.get("detect_s"), "restart_s": record.get("restart_s"),
            "lost_steps": record.get("steps_lost"), "runs": len(runs), "epoch_s": round(epoch_s, 2),
            "finished": read(status).get("state") == "finished"}


def run() -> list[dict[str, Any]]:
    results = []
    with slurm_cluster() as inventory:
        epochs = 40  # the fault comes about 4 epochs after FAULT_EPOCH (2 s at about 0.5 s an epoch)
        for index, name in enumerate(SCENARIOS):
            if SCENARIOS[name][0] is None:  # the time limit: 50 s of training, longer than its first run gives
                epochs = max(FAULT_EPOCH + 1, round(50 / max(r["epoch_s"] for r in results)))
            results.append(measure(inventory, name, index, epochs))
            print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    return results


def main() -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    rows = run()
    print("| failure | cause on record | detected, s | training again after, s | steps trained again | Slurm runs "
          "of the job | finished |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['scenario']} | {row['cause']} | {row['detect_s']} | {row['restart_s']} | {row['lost_steps']} "
              f"| {row['runs']} | {'yes' if row['finished'] else 'no'} |")
    return 0 if all(row["finished"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
