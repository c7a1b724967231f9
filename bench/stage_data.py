"""stage-data.yml on independent local clusters of growing size, measured as a user would see it.

    .venv/bin/python -m bench.stage_data [--nodes 2 4 8 16] [--files 520]      (root; about 20 minutes on 2 cores)

A dataset of already-compressed data (random bytes, 1 to 3 MiB a file: about 1.07 GB in 520 files, like short video
clips) is written once on the controller. For each size N: a fresh local cluster (playbooks/local-cluster.yml) with
setup-cluster.yml (the SSH mesh the nodes copy over), then stage-data.yml three times: the first copy, a rerun with
nothing changed, and a rerun after one 2 MiB file was added. Measured, besides wall time and the plan's rounds:
  - bytes the controller sent to the nodes: the tx counter of the cluster's bridge, the controller's only way to them
    (rsync and Ansible's own traffic alike);
  - bytes each node received, from the controller and from other nodes: the tx counter of its veth, bridge side.
Baselines from the same run: the dataset's size, the added file's size, and each node's bytes in the rerun with
nothing changed (Ansible's own traffic of a run, which the added-file run also carries).
Goals (issue 18): controller bytes <= 1.2x the dataset at every size; the unchanged rerun <= 1% of it; one added
file: each node receives <= 2x that file; rounds 1 + ceil(log2 N).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = REPO / ".venv" / "bin"
CLUSTER_PLAYBOOK = REPO / "playbooks" / "local-cluster.yml"
DEST = "data/bench-stage"
ADDED_BYTES = 2 << 20


def counter(link: str) -> int:
    return int(Path(f"/sys/class/net/{link}/statistics/tx_bytes").read_text())


def playbook(*args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    env = {**os.environ, "PATH": f"{VENV_BIN}:{os.environ['PATH']}", "ANSIBLE_NOCOLOR": "1"}
    start = time.monotonic()
    proc = subprocess.run([str(VENV_BIN / "ansible-playbook"), *args], cwd=REPO, env=env, capture_output=True,
                          text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"ansible-playbook {' '.join(args)} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-2000:]}")
    return proc, time.monotonic() - start


def make_dataset(root: Path, files: int, seed: int = 0) -> int:
    """Random (incompressible) files of 1 to 3 MiB in class folders; returns the total size."""
    rng, total = random.Random(seed), 0
    for i in range(files):
        size = rng.randint(1 << 20, 3 << 20)
        path = root / f"class{i % 40:02}" / f"clip{i:04}.mp4"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(size))
        total += size
    return total


def measure(name: str, nodes: int, inventory: Path, src: Path) -> dict[str, object]:
    """One stage-data.yml run: wall time, the plan's rounds, bytes the controller sent, bytes each node received."""
    links = [f"vcv-{name}-{i}" for i in range(nodes)]
    bridge, received = counter(f"vcbr-{name}"), [counter(link) for link in links]
    proc, seconds = playbook("-i", str(inventory), "playbooks/stage-data.yml", "-e",
                             json.dumps({"src": str(src), "dest": DEST}))
    rounds = re.search(r"in (\d+) round\(s\)", " ".join(proc.stdout.split()))
    return {"seconds": seconds, "rounds": int(rounds[1]) if rounds else 0,
            "controller": counter(f"vcbr-{name}") - bridge,
            "nodes": [counter(link) - before for link, before in zip(links, received, strict=True)]}


def run_size(nodes: int, src: Path, size: int) -> dict[str, object]:
    name = f"bstage{nodes}"
    subprocess.run([str(VENV_BIN / "ansible-playbook"), str(CLUSTER_PLAYBOOK), "-e", f"cluster_name={name}", "-e",
                    "state=absent"], cwd=REPO, check=False, capture_output=True)  # fmt: skip
    try:
        playbook(str(CLUSTER_PLAYBOOK), "-e", f"nodes={nodes}", "-e", f"cluster_name={name}")
        inventory = REPO / ".local-cluster" / name / "inventory.yml"
        playbook("-i", str(inventory), "setup-cluster.yml")
        first = measure(name, nodes, inventory, src)
        rerun = measure(name, nodes, inventory, src)
        added = src / "class00" / f"added-{nodes}.mp4"
        added.write_bytes(os.urandom(ADDED_BYTES))
        try:
            one = measure(name, nodes, inventory, src)
        finally:
            added.unlink()
        return {"nodes": nodes, "dataset": size, "first": first, "rerun": rerun, "added": one}
    finally:
        subprocess.run([str(VENV_BIN / "ansible-playbook"), str(CLUSTER_PLAYBOOK), "-e", f"cluster_name={name}",
                        "-e", "state=absent"], cwd=REPO, check=False, capture_output=True)  # fmt: skip


def table(rows: list[dict]) -> str:
    lines = ["| nodes | first copy | controller sent | vs dataset | rounds (1 + log2 N) | nothing changed "
             "| controller sent | vs dataset | one 2 MiB file added | most one node received | vs file "
             "| net of Ansible's own | met |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        n, size, first, rerun, added = r["nodes"], r["dataset"], r["first"], r["rerun"], r["added"]
        want_rounds = 1 + math.ceil(math.log2(n))
        most = max(added["nodes"])
        net = max(a - b for a, b in zip(added["nodes"], rerun["nodes"], strict=True))
        met = (first["controller"] <= 1.2 * size and rerun["controller"] <= 0.01 * size and most <= 2 * ADDED_BYTES
               and first["rounds"] == want_rounds)
        lines.append(
            f"| {n} | {first['seconds']:.0f} s | {first['controller'] / 1e9:.3f} GB | "
            f"{first['controller'] / size:.3f}x | {first['rounds']} ({want_rounds}) | {rerun['seconds']:.0f} s | "
            f"{rerun['controller'] / 1e6:.1f} MB | {100 * rerun['controller'] / size:.2f}% | "
            f"{added['seconds']:.0f} s | {most / 1e6:.2f} MB | {most / ADDED_BYTES:.2f}x | "
            f"{net / ADDED_BYTES:.2f}x | {'yes' if met else '**no**'} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[2, 4, 8, 16], help="cluster sizes, in order")
    parser.add_argument("--files", type=int, default=520, help="files in the dataset (1 to 3 MiB each)")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("needs root (network namespaces, sshd)", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="bench-stage-"))
    rows, start, load = [], time.monotonic(), os.getloadavg()[0]
    try:
        src = work / "dataset"
        size = make_dataset(src, args.files)
        print(f"dataset: {args.files} files, {size / 1e9:.3f} GB in {src}", file=sys.stderr, flush=True)
        for nodes in args.nodes:
            rows.append(run_size(nodes, src, size))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(table(rows))
    print(f"\n{os.cpu_count()} CPU cores (load average {load:.1f} before, {os.getloadavg()[0]:.1f} after: other work "
          f"on the machine), {time.monotonic() - start:.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
