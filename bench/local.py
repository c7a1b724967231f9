"""Local clusters for the benchmarks that run playbooks (root): build one, set it up, stage a small dataset, and
remove it afterwards, whatever happens in between."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = REPO / ".venv" / "bin"
NEEDS_ROOT = "needs root (network namespaces, sshd)"
ENV = {**os.environ, "PATH": f"{VENV_BIN}:{os.environ['PATH']}", "ANSIBLE_NOCOLOR": "1"}


def playbook(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(VENV_BIN / "ansible-playbook"), *args], cwd=REPO, env=ENV, capture_output=True,
                          text=True, check=check)


def inventory(name: str) -> Path:
    return REPO / ".local-cluster" / name / "inventory.yml"


def build(name: str, nodes: int, *extra: str) -> None:
    """Create (or repair: bring a killed node's sshd back) the local cluster ``name``."""
    playbook("playbooks/local-cluster.yml", "-e", f"nodes={nodes}", "-e", f"cluster_name={name}", *extra)


@contextlib.contextmanager
def training_cluster(name: str, nodes: int, *extra: str) -> Iterator[Path]:
    """A set-up local cluster with the demo's small two-class dataset at ~/data/vidcluster-test on every node (what
    configs/i3d_cpu_test.yaml reads); yields its inventory. ``extra``: more -e settings of local-cluster.yml."""
    if os.geteuid() != 0:
        raise RuntimeError(NEEDS_ROOT)
    build(name, nodes, *extra)
    try:
        playbook("-i", str(inventory(name)), "setup-cluster.yml")
        with tempfile.TemporaryDirectory() as tmp:
            data = Path(tmp) / "vidcluster-test"
            subprocess.run([str(VENV_BIN / "python"), "-m", "trainer", "make-dataset", str(data), "--classes",
                            "left", "right"], cwd=REPO, check=True, capture_output=True)  # fmt: skip
            playbook("-i", str(inventory(name)), "playbooks/stage-data.yml", "-e", f"src={data}", "-e",
                     "dest=data/vidcluster-test")
        yield inventory(name)
    finally:
        playbook("playbooks/local-cluster.yml", "-e", f"cluster_name={name}", "-e", "state=absent", check=False)


def signal_node(cluster: str, node: int, sig: signal.Signals) -> None:
    """``sig`` to every process of the local cluster's node (its network namespace)."""
    out = subprocess.run(["ip", "netns", "pids", f"vc-{cluster}-{node}"], capture_output=True, text=True).stdout
    for pid in out.split():
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), sig)
