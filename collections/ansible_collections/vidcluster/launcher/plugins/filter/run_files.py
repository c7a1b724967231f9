"""Filters on a run directory's files as the trainer names them (trainer/runtime/contract.py): both launchers
(roles/ddp_launch over SSH, roles/slurm_launch through the shared home) collect them when a job ends.

``FilterModule`` registers the plain functions below for Ansible.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable
from typing import Any

from ansible_collections.vidcluster.launcher.plugins.plugin_utils.trainer import trainer_module

contract = trainer_module("runtime.contract")


def required_run_file(path: str) -> bool:
    """Whether a run's file must be there when the job ends (collecting fails without it)."""
    return posixpath.basename(path) in contract.REQUIRED_RUN_FILES


def metrics_file(run_dir: str) -> str:
    """The run's metrics (one JSON record a line) in ``run_dir``."""
    return posixpath.join(run_dir, contract.METRICS_FILE)


class FilterModule:
    def filters(self) -> dict[str, Callable[..., Any]]:
        return {"required_run_file": required_run_file, "metrics_file": metrics_file}
