"""Which GPU a worker takes and which CPUs it runs on (trainer.distributed.gpu_index, trainer.numa): a worker that sees
every GPU of its node takes its own, one that sees one GPU (srun --gpus-per-task=1) takes that one, one that would
share a GPU is refused; a GPU trainer's CPUs are its GPU's socket's, read from a sysfs tree (here a two-socket machine
with sub-NUMA clustering, written into a folder), and binding reaches every thread of the process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainer.distributed import DistributedError, gpu_index
from trainer.numa import parse_cpulist, pci_address, socket_cpus

REPO = Path(__file__).resolve().parents[2]


def test_a_worker_takes_its_own_gpu_or_the_one_it_sees() -> None:
    assert [gpu_index(rank, 8) for rank in range(8)] == list(range(8))  # every worker sees the node's 8 GPUs
    assert [gpu_index(rank, 1) for rank in range(8)] == [0] * 8  # srun --gpus-per-task=1: each sees its own
    with pytest.raises(DistributedError, match=r"^local worker 5 sees 4 GPUs .*: it would share one with another "
                                               r"worker; give every worker of a node all of its GPUs"):
        gpu_index(5, 4)


def two_sockets(root: Path, gpu_node: str) -> Path:
    """A sysfs tree: 16 CPUs, socket 0 = CPUs 0-7 (NUMA nodes 0 and 1), socket 1 = 8-15 (nodes 2 and 3: sub-NUMA
    clustering), node 4 memory alone (no CPUs); one GPU at 0000:b3:00.0 on NUMA node ``gpu_node``."""
    for cpu in range(16):
        topology = root / "devices" / "system" / "cpu" / f"cpu{cpu}" / "topology"
        topology.mkdir(parents=True)
        (topology / "physical_package_id").write_text(f"{cpu // 8}\n")
    for node, cpus in enumerate(["0-3", "4-7", "8-11", "12-15", ""]):
        folder = root / "devices" / "system" / "node" / f"node{node}"
        folder.mkdir(parents=True)
        (folder / "cpulist").write_text(cpus + "\n")
    gpu = root / "bus" / "pci" / "devices" / "0000:b3:00.0"
    gpu.mkdir(parents=True)
    (gpu / "numa_node").write_text(gpu_node + "\n")
    return root


def test_a_gpus_cpus_are_its_sockets_not_only_its_numa_nodes(tmp_path: Path) -> None:
    assert parse_cpulist("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11} and parse_cpulist("\n") == set()
    assert pci_address(0, 0xB3, 0) == "0000:b3:00.0"
    cpus, where = socket_cpus("0000:b3:00.0", two_sockets(tmp_path / "snc", "2"))
    assert cpus == set(range(8, 16)) and where == "socket 1 (NUMA node 2 of 0000:b3:00.0)"
    cpus, where = socket_cpus("0000:b3:00.0", two_sockets(tmp_path / "vm", "-1"))
    assert cpus == set() and where == "sysfs names no NUMA node for 0000:b3:00.0"
    cpus, where = socket_cpus("0000:b3:00.0", two_sockets(tmp_path / "memory", "4"))
    assert cpus == set() and where == "NUMA node 4 of 0000:b3:00.0 has no CPUs"
    cpus, where = socket_cpus("0000:17:00.0", tmp_path / "snc")  # a GPU sysfs does not show
    assert cpus == set() and where == (f"sysfs does not say where 0000:17:00.0 is: No such file or directory: "
                                       f"{tmp_path}/snc/bus/pci/devices/0000:17:00.0/numa_node")


def test_this_machines_sysfs_reads_as_the_tree_above() -> None:
    """The same files on this machine: its first CPU's socket holds it (a real sysfs, not only the tree above)."""
    package = Path("/sys/devices/system/cpu/cpu0/topology/physical_package_id").read_text().strip()
    node0 = parse_cpulist(Path("/sys/devices/system/node/node0/cpulist").read_text())
    assert package.isdigit() and 0 in node0


def test_binding_reaches_every_thread_of_the_process() -> None:
    """A thread started before the binding (the heartbeat's, in a trainer) is bound too; the loaders started after
    inherit the mask."""
    cpu = min(os.sched_getaffinity(0))
    probe = ("import os, threading, time; from trainer.numa import bind_process; "
             "threading.Thread(target=time.sleep, args=(5,), daemon=True).start(); "
             f"bind_process({{{cpu}}}); "
             "print(sorted({tuple(sorted(os.sched_getaffinity(int(t)))) for t in os.listdir('/proc/self/task')}))")
    proc = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=60,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == f"[({cpu},)]"
