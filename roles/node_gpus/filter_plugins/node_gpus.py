"""Filters of the node_gpus role: nvidia-smi's CSV lines as GPUs, and the refusal of GPUs split by MIG.

A plain function, so tests import this file directly; ``FilterModule`` only registers it for Ansible.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any


def parse_gpus(smi_lines: Sequence[str]) -> list[dict[str, Any]]:
    """GPUs from ``nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader`` lines (a
    name may hold commas: the other fields are split off its ends)."""
    gpus = []
    for line in smi_lines:
        if line.strip():
            index, rest = line.split(",", 1)
            name, driver, memory = (field.strip() for field in rest.rsplit(",", 2))
            gpus.append({"index": int(index), "name": name, "driver": driver, "memory": memory})
    return gpus


def mig_problem(mig_lines: Sequence[str], gpus: Sequence[Mapping[str, Any]], node: str) -> str:
    """Why the node cannot train on its GPUs, from ``nvidia-smi --query-gpu=index,mig.mode.current --format=csv,
    noheader`` lines ('0, Enabled'; '[N/A]' where a GPU has no MIG): '' when no GPU has MIG enabled.

    A GPU in MIG mode is split into instances that CUDA shows one to a process, with no NVLink or peer access between
    them, and the trainer runs one process per whole GPU with NCCL between them: refused, naming the GPUs.
    """
    names = {str(gpu["index"]): gpu["name"] for gpu in gpus}
    split = [index for index, mode in (line.split(",", 1) for line in mig_lines if "," in line)
             if mode.strip() == "Enabled"]
    if not split:
        return ""
    listed = ", ".join(f"GPU {index.strip()} {names.get(index.strip(), '')}".rstrip() for index in split)
    return (f"{node}: MIG is enabled on {listed}; VidCluster trains one process per whole GPU (NCCL does not run "
            "between MIG instances): disable it (nvidia-smi -i <index> -mig 0 as root, then reset the GPU or reboot) "
            "or leave the node out of the inventory")


class FilterModule:
    """Registers the filters as node_gpus_<name>."""

    def filters(self) -> dict[str, Callable[..., Any]]:
        return {"node_gpus_parse": parse_gpus, "node_gpus_mig_problem": mig_problem}
