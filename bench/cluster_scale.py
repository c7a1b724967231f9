"""setup-cluster.yml and the all-pairs SSH check on local clusters of growing size, measured in one run.

    .venv/bin/python bench/cluster_scale.py [--nodes 2 8 16 32] [--check-repeats 5]     (root; tens of minutes)

For each size N: a fresh local cluster (network-namespace hosts with their own sshd, playbooks/local-cluster.yml),
setup-cluster.yml run twice. Printed per run: wall time, the controller's CPU seconds (ansible-playbook and its
children; the nodes' own work runs under their sshd and is not counted), and module results per node (every task
result and loop item, by bench/callback_plugins/count_results.py). Then, on the largest cluster, the all-pairs check
alone --check-repeats times (false failures: any broken pair, none being broken), and once with one node's sshd
stopped (exactly the pairs into that node must be reported, as refused).

Goals (issue "Real clusters II"): module results per node constant in N (largest <= 1.1x the smallest), controller
CPU per node not growing with N, rerun <= 0.6x the first run, every healthy size passing.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = REPO / ".venv" / "bin"
CLUSTER_PLAYBOOK = REPO / "playbooks" / "local-cluster.yml"
PAIR = re.compile(r"(\S+) -> (\S+): (\w+) \(")


@dataclass
class Run:
    ok: bool
    seconds: float
    cpu: float  # controller CPU seconds (user + system) of the playbook and its children
    results: dict[str, int]  # module results per host
    stdout: str

    def per_node(self, nodes: list[str]) -> float:
        return sum(self.results.get(n, 0) for n in nodes) / len(nodes)


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def playbook(inventory: Path | None, *args: str) -> Run:
    with tempfile.NamedTemporaryFile(suffix=".json") as counts:
        env = {**os.environ, "PATH": f"{VENV_BIN}:{os.environ['PATH']}", "ANSIBLE_NOCOLOR": "1",
               "ANSIBLE_CALLBACK_PLUGINS": str(REPO / "bench" / "callback_plugins"),
               "ANSIBLE_CALLBACKS_ENABLED": "count_results", "VIDCLUSTER_COUNT_RESULTS": counts.name}
        cmd = [str(VENV_BIN / "ansible-playbook"), *(["-i", str(inventory)] if inventory else []), *args]
        cpu, start = children_cpu(), time.monotonic()
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, check=False)
        seconds, cpu = time.monotonic() - start, children_cpu() - cpu
        results = json.loads(Path(counts.name).read_text() or "{}")
    return Run(proc.returncode == 0, seconds, cpu, results, proc.stdout)


def make_cluster(name: str, nodes: int) -> Path:
    subprocess.run([str(VENV_BIN / "ansible-playbook"), str(CLUSTER_PLAYBOOK), "-e", f"nodes={nodes}", "-e",
                    f"cluster_name={name}"], cwd=REPO, check=True, capture_output=True)  # fmt: skip
    return REPO / ".local-cluster" / name / "inventory.yml"


def drop_cluster(name: str) -> None:
    subprocess.run([str(VENV_BIN / "ansible-playbook"), str(CLUSTER_PLAYBOOK), "-e", f"cluster_name={name}", "-e",
                    "state=absent"], cwd=REPO, check=False, capture_output=True)  # fmt: skip


def node_names(n: int) -> list[str]:
    return [f"node{i}" for i in range(n)]


def check_repeats(inventory: Path, nodes: int, repeats: int) -> list[str]:
    lines = []
    for i in range(repeats):
        run = playbook(inventory, "playbooks/ssh-check.yml")
        broken = PAIR.findall(run.stdout)
        lines.append(f"  check {i + 1}/{repeats} on {nodes} nodes: {'passed' if run.ok else 'FAILED'} in "
                     f"{run.seconds:.1f} s, {len(broken)} pairs reported broken (false failures)")
    return lines


def check_with_sshd_down(name: str, inventory: Path, nodes: int) -> str:
    down = nodes - 1
    pid = int((REPO / ".local-cluster" / name / "nodes" / str(down) / "sshd.pid").read_text())
    os.kill(pid, signal.SIGTERM)
    time.sleep(1)
    try:
        run = playbook(inventory, "playbooks/ssh-check.yml")
    finally:
        make_cluster(name, nodes)  # sshd back
    reported = {(src, dst): reason for src, dst, reason in PAIR.findall(run.stdout)}
    into = {(f"node{i}", f"node{down}") for i in range(nodes)}
    refused_into = {pair for pair, reason in reported.items() if pair in into and reason == "refused"}
    others = {pair: reason for pair, reason in reported.items() if f"node{down}" not in pair}
    exact = not others and len(refused_into) >= nodes - 1  # node{down}'s own row is unreachable to the controller
    return (f"  sshd of node{down} stopped: {len(reported)} pairs reported, {len(refused_into)} into node{down} as "
            f"refused, {len(others)} others -> {'exact' if exact else 'NOT exact'}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[2, 8, 16, 32], help="cluster sizes, in order")
    parser.add_argument("--check-repeats", type=int, default=5, help="all-pairs checks on the largest cluster")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("needs root (network namespaces, sshd)", file=sys.stderr)
        return 2
    rows, extra = [], []
    base: dict[str, float] = {}
    for n in args.nodes:
        name = f"bench{n}"
        drop_cluster(name)
        inventory = make_cluster(name, n)
        try:
            first = playbook(inventory, "setup-cluster.yml")
            rerun = playbook(inventory, "setup-cluster.yml")
            nodes = node_names(n)
            row = {"nodes": n, "first_s": first.seconds, "rerun_s": rerun.seconds, "rerun_ratio": rerun.seconds
                   / first.seconds, "cpu_per_node": first.cpu / n, "results_per_node": first.per_node(nodes),
                   "ok": first.ok and rerun.ok}  # fmt: skip
            if not first.ok:
                extra.append(f"  {n} nodes: setup FAILED:\n" + first.stdout[-3000:])
            base = base or row
            rows.append(row)
            print(json.dumps(row), flush=True)
            if n == args.nodes[-1]:
                extra += check_repeats(inventory, n, args.check_repeats)
                extra.append(check_with_sshd_down(name, inventory, n))
        finally:
            drop_cluster(name)
    print()
    print("| nodes | first run | rerun | rerun/first | controller CPU/node | vs smallest | module results/node "
          "| vs smallest | passed |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['nodes']} | {row['first_s']:.1f} s | {row['rerun_s']:.1f} s | {row['rerun_ratio']:.2f}x | "
              f"{row['cpu_per_node']:.2f} s | {row['cpu_per_node'] / base['cpu_per_node']:.2f}x | "
              f"{row['results_per_node']:.1f} | {row['results_per_node'] / base['results_per_node']:.2f}x | "
              f"{'yes' if row['ok'] else 'NO'} |")
    print("\n".join(extra))
    return 0 if all(row["ok"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
