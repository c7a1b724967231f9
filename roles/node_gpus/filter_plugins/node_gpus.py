"""Filter of the node_gpus role: nvidia-smi's CSV lines as GPUs.

A plain function, so tests import this file directly; ``FilterModule`` only registers it for Ansible.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
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


class FilterModule:
    """Registers the filter as node_gpus_parse."""

    def filters(self) -> dict[str, Callable[..., Any]]:
        return {"node_gpus_parse": parse_gpus}
