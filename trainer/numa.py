"""Each GPU trainer on the CPUs of its GPU's socket, with its data-loader workers.

An 8-GPU node runs 8 trainers and their loader workers (hundreds of processes). Unbound, the kernel places them on
any core: a loader's decoded clips, the pinned buffer they are copied into and the copy to the GPU cross the link
between the sockets whenever they land on the far one. A trainer binds itself when it takes its GPU, before it
starts a loader worker (which inherits the mask): every thread of the process gets the CPUs of the socket its GPU
hangs off, found in sysfs (the GPU's PCI address -> its NUMA node -> that node's socket -> the socket's CPUs), less
any CPU this process may not use already (a Slurm or cgroup confinement, taskset, torchrun --numa-binding: the
narrower set wins). The socket, not the NUMA node (torchrun's ``--numa-binding node``): with sub-NUMA clustering
(Intel SNC, AMD NPS2/NPS4) a socket has 2 to 4 nodes, and 4 trainers' loaders on a quarter of a socket's cores
would starve, while memory within a socket is close to uniform.

Nothing is bound where sysfs names no NUMA node for the GPU (-1: a machine with one node, most VMs) or does not show
it (a container without /sys/bus/pci), or where none of the socket's CPUs is allowed here; ``bind_to_gpu`` says
which, and the trainer logs it.
"""

from __future__ import annotations

import os
from pathlib import Path

SYSFS = Path("/sys")


def parse_cpulist(text: str) -> set[int]:
    """CPUs of a sysfs list ('0-3,8,10-11')."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if part:
            first, _, last = part.partition("-")
            cpus.update(range(int(first), int(last or first) + 1))
    return cpus


def pci_address(domain: int, bus: int, device: int) -> str:
    """sysfs's name of a GPU's PCI function ('0000:1b:00.0'), from torch's device properties."""
    return f"{domain:04x}:{bus:02x}:{device:02x}.0"


def socket_cpus(pci: str, sysfs: Path = SYSFS) -> tuple[set[int], str]:
    """The CPUs of the socket the PCI device ``pci`` hangs off, and where they came from; (set(), why) when sysfs
    names no NUMA node for it, or does not show it (a container without /sys/bus/pci)."""
    try:
        return _socket_cpus(pci, sysfs)
    except OSError as exc:
        return set(), f"sysfs does not say where {pci} is: {exc.strerror}: {exc.filename}"


def _socket_cpus(pci: str, sysfs: Path) -> tuple[set[int], str]:
    node = int((sysfs / "bus" / "pci" / "devices" / pci / "numa_node").read_text())
    if node < 0:
        return set(), f"sysfs names no NUMA node for {pci}"
    cpus = sysfs / "devices" / "system" / "cpu"
    node_cpus = parse_cpulist((sysfs / "devices" / "system" / "node" / f"node{node}" / "cpulist").read_text())
    if not node_cpus:
        return set(), f"NUMA node {node} of {pci} has no CPUs"
    package = (cpus / f"cpu{min(node_cpus)}" / "topology" / "physical_package_id").read_text().strip()
    same = {int(path.parent.parent.name.removeprefix("cpu"))
            for path in cpus.glob("cpu[0-9]*/topology/physical_package_id") if path.read_text().strip() == package}
    return same, f"socket {package} (NUMA node {node} of {pci})"


def bind_process(cpus: set[int]) -> None:
    """Every thread of this process on ``cpus`` (sched_setaffinity binds one thread: threads started before, such as
    the heartbeat's, keep their mask otherwise)."""
    for task in Path("/proc/self/task").iterdir():
        try:
            os.sched_setaffinity(int(task.name), cpus)
        except ProcessLookupError:
            continue  # a thread that ended meanwhile


def bind_to_gpu(device_index: int, sysfs: Path = SYSFS) -> str:
    """Bind this process to the socket of GPU ``device_index`` (as this process numbers its GPUs), as the module
    docstring says; one line saying what was done, for the log."""
    import torch

    props = torch.cuda.get_device_properties(device_index)
    pci = pci_address(props.pci_domain_id, props.pci_bus_id, props.pci_device_id)
    cpus, where = socket_cpus(pci, sysfs)
    allowed = os.sched_getaffinity(0)
    if not cpus:
        return f"GPU {device_index}: not bound to CPUs ({where})"
    if not cpus & allowed:
        return f"GPU {device_index}: not bound to CPUs (none of {where}'s is allowed to this process)"
    bind_process(cpus & allowed)
    return f"GPU {device_index}: bound to the {len(cpus & allowed)} CPUs of {where}"
