"""From `ansible-playbook launch-training.yml` to the first training step on every node, against the bare import time.

    .venv/bin/python bench/launch_overhead.py [--repeats 3]     (root: builds a 2-node local cluster, ~2 minutes)

Baseline, measured in the same run: `python -c "import torch, torchvision, decord"` on a node (inside its network
namespace, with its environment), which every trainer pays before it can do anything. The launch is timed from the
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
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = REPO / ".venv" / "bin"
CLUSTER = "lover"
INVENTORY = REPO / ".local-cluster" / CLUSTER / "inventory.yml"
FIRST_STEP = re.compile(r"^(\d\d:\d\d:\d\d) INFO epoch 1 iteration 1:", re.M)


def playbook(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{VENV_BIN}:{os.environ['PATH']}", "ANSIBLE_NOCOLOR": "1"}
    return subprocess.run([str(VENV_BIN / "ansible-playbook"), *args], cwd=REPO, env=env, capture_output=True,
                          text=True, check=True)


def bare_import_seconds() -> float:
    """The import every trainer pays, on node1 with the nodes' environment."""
    code = "import time; t = time.perf_counter(); import torch, torchvision, decord; print(time.perf_counter() - t)"
    out = subprocess.run(["ip", "netns", "exec", f"vc-{CLUSTER}-1", "/opt/vidcluster/venv/bin/python", "-c", code],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    return float(out.strip())


def first_step_seconds(job: str, started: datetime.datetime) -> float:
    """Seconds from ``started`` to rank 0's first logged step of ``job``."""
    log = REPO / ".local-cluster" / CLUSTER / "nodes" / "0" / "home" / "vidcluster" / "jobs" / job / "run" / "log.txt"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        match = FIRST_STEP.search(log.read_text()) if log.exists() else None
        if match:
            clock = datetime.datetime.combine(started.date(), datetime.time.fromisoformat(match[1]))
            return (clock - started.replace(microsecond=0)).total_seconds()
        time.sleep(0.2)
    raise SystemExit(f"no first step of {job} in {log}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="launches measured (and bare imports)")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("needs root (network namespaces, sshd)", file=sys.stderr)
        return 2
    playbook("playbooks/local-cluster.yml", "-e", "nodes=2", "-e", f"cluster_name={CLUSTER}")
    try:
        playbook("-i", str(INVENTORY), "setup-cluster.yml")
        with tempfile.TemporaryDirectory() as tmp:
            data = Path(tmp) / "vidcluster-test"
            subprocess.run([str(VENV_BIN / "python"), "-m", "trainer", "make-dataset", str(data), "--classes",
                            "left", "right"], cwd=REPO, check=True, capture_output=True)  # fmt: skip
            playbook("-i", str(INVENTORY), "playbooks/stage-data.yml", "-e", f"src={data}", "-e",
                     "dest=data/vidcluster-test")
        imports, launches = [], []
        for i in range(args.repeats):
            imports.append(bare_import_seconds())
            job = f"overhead-{os.getpid()}-{i}"
            overrides = {"CONFIG": {"TRAIN": {"EPOCH_NUM": 1}, "LOG": {"DISPLAY_FREQ": 1}}}
            started = datetime.datetime.now()
            playbook("-i", str(INVENTORY), "launch-training.yml", "-e", "config=i3d_cpu_test", "-e", f"job_id={job}",
                     "-e", "wait=false", "-e", "ddp_launch_omp_num_threads=1",
                     "-e", json.dumps({"ddp_config_overrides": overrides}))  # fmt: skip
            launches.append(first_step_seconds(job, started))
            playbook("-i", str(INVENTORY), "stop-training.yml", "-e", f"job_id={job}")
    finally:
        playbook("playbooks/local-cluster.yml", "-e", f"cluster_name={CLUSTER}", "-e", "state=absent")
    imported, launched = min(imports), min(launches)
    print(f"| measure | seconds (best of {args.repeats}) |")
    print("|---|---|")
    print(f"| bare `import torch, torchvision, decord` on a node | {imported:.1f} |")
    print(f"| launch-training.yml start -> first training step on every node | {launched:.1f} |")
    print(f"| launch overhead beyond the import | {launched - imported:.1f} (goal <= 10) |")
    return 0 if launched - imported <= 10 else 1


if __name__ == "__main__":
    sys.exit(main())
