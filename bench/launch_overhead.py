"""From `ansible-playbook launch-training.yml` to the first training step on every node, against the bare import time.

    .venv/bin/python -m bench.launch_overhead [--repeats 3]     (root: builds a 2-node local cluster, ~2 minutes)
    .venv/bin/python -m bench --only launch                    (the same, as a row of the benchmark table)

Baseline, measured in the same run: `import torch, torchvision, decord` on a node (inside its network and mount
namespaces, with its environment), which every trainer pays before it can do anything. The launch is timed from the
playbook's start to the first optimizer step of the job: rank 0 logs it (LOG.DISPLAY_FREQ 1), and a DDP step
completes on every rank together (the gradient all-reduce waits for all of them). Goal (issue "Speed"): launch to
first step <= bare import + 10 s.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import time

from bench.local import REPO, playbook, training_cluster

CLUSTER = "lover"
CLUSTER_DIR = REPO / ".local-cluster" / CLUSTER
INVENTORY = CLUSTER_DIR / "inventory.yml"
GOAL_S = 10.0
FIRST_STEP = re.compile(r"^(\d\d:\d\d:\d\d) INFO epoch 1 iteration 1:", re.M)


def bare_import_seconds() -> float:
    """The import every trainer pays, on node1 with the nodes' environment (its network and mount namespaces: the
    environment is mounted there only)."""
    code = "import time; t = time.perf_counter(); import torch, torchvision, decord; print(time.perf_counter() - t)"
    sshd = (CLUSTER_DIR / "nodes" / "1" / "sshd.pid").read_text().strip()
    out = subprocess.run(["nsenter", "-t", sshd, "-m", "-n", "--", "/opt/vidcluster/venv/bin/python", "-c", code],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    return float(out.strip())


def first_step_seconds(job: str, started: datetime.datetime) -> float:
    """Seconds from ``started`` to rank 0's first logged step of ``job``."""
    log = CLUSTER_DIR / "nodes" / "0" / "home" / "vidcluster" / "jobs" / job / "run" / "log.txt"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        match = FIRST_STEP.search(log.read_text()) if log.exists() else None
        if match:
            clock = datetime.datetime.combine(started.date(), datetime.time.fromisoformat(match[1]))
            return (clock - started.replace(microsecond=0)).total_seconds()
        time.sleep(0.2)
    raise SystemExit(f"no first step of {job} in {log}")


def run(repeats: int) -> dict[str, float]:
    """The bare import on a node (best of ``repeats``) and launch-training.yml's start to the first step: the first
    launch, which ships the trainer code to the nodes, and the best of the later ones (new jobs, code in place)."""
    with training_cluster(CLUSTER, 2):
        imports, launches = [], []
        for i in range(repeats):
            imports.append(bare_import_seconds())
            job = f"overhead-{os.getpid()}-{i}"
            overrides = {"CONFIG": {"TRAIN": {"EPOCH_NUM": 1}, "LOG": {"DISPLAY_FREQ": 1}}}
            started = datetime.datetime.now()
            playbook("-i", str(INVENTORY), "launch-training.yml", "-e", "config=i3d_cpu_test", "-e", f"job_id={job}",
                     "-e", "wait=false", "-e", "ddp_config_omp_num_threads=1",
                     "-e", json.dumps({"ddp_config_overrides": overrides}))  # fmt: skip
            launches.append(first_step_seconds(job, started))
            playbook("-i", str(INVENTORY), "stop-training.yml", "-e", f"job_id={job}")
    return {"import_s": min(imports), "first_launch_s": launches[0], "launch_s": min(launches[1:] or launches)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="launches measured (and bare imports), at least 2")
    args = parser.parse_args()
    try:
        r = run(args.repeats)
    except RuntimeError as exc:
        print(exc, file=sys.stderr)
        return 2
    overheads = (r["first_launch_s"] - r["import_s"], r["launch_s"] - r["import_s"])
    print("| measure | seconds |")
    print("|---|---|")
    print(f"| bare `import torch, torchvision, decord` on a node (best of {args.repeats}) | {r['import_s']:.1f} |")
    print(f"| first launch (ships the trainer code) -> first training step on every node | {r['first_launch_s']:.1f} |")
    print(f"| later launches, new jobs (best of {args.repeats - 1}) -> first training step | {r['launch_s']:.1f} |")
    print(f"| launch overhead beyond the import, first / later | {overheads[0]:.1f} / {overheads[1]:.1f} "
          f"(goal <= {GOAL_S:.0f}) |")
    return 0 if max(overheads) <= GOAL_S else 1


if __name__ == "__main__":
    sys.exit(main())
