"""Filters of the ddp_launch role, reading what the nodes' runtime prints about their part of a job
(``python -m trainer.runtime status``). The words are the trainer's (trainer/runtime/report.py); this file only
adapts them to Ansible's results.

``FilterModule`` registers the plain functions below for Ansible.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from ansible_collections.vidcluster.launcher.plugins.plugin_utils.trainer import trainer_function, trainer_module

REPORT = "runtime.report"  # trainer/runtime/report.py: the words of every node's and job's state


def node_state(result: Mapping[str, Any]) -> dict[str, Any]:
    """A node's state from a registered runtime call; a node the controller could not reach is 'unreachable'."""
    if result.get("unreachable") or result.get("skipped") or "stdout" not in result:
        return {"state": "unreachable", "detail": str(result.get("msg", "")).strip()}
    return json.loads(result["stdout"])


def node_states(hostvars: Mapping[str, Any], hosts: list[str], register: str) -> dict[str, dict[str, Any]]:
    """Every host's state from the result each registered as ``register``."""
    return {host: node_state(hostvars[host].get(register) or {"unreachable": True}) for host in hosts}


def hub(states: Mapping[str, Mapping[str, Any]]) -> str:
    """The job's hub as the freshest record among the nodes' states names it ('' when no node knows the job)."""
    report = trainer_module(REPORT)
    return report.hub_of(report.freshest(states))


def job_lines(stdout: str) -> list[str]:
    """training-status.yml's lines for one node: one per job (the runtime prints one JSON object per job)."""
    report = trainer_module(REPORT)
    return [report.node_line(json.loads(line)) for line in stdout.splitlines() if line.strip()] or ["no job here"]


class FilterModule:
    """Registers the functions above as Ansible filters."""

    def filters(self) -> dict[str, Callable[..., Any]]:
        return {
            "ddp_launch_node_states": node_states,
            "ddp_launch_hub": hub,
            "ddp_launch_rank0": trainer_function(REPORT, "rank0_of"),
            "ddp_launch_end_report": trainer_function(REPORT, "end_report"),
            "ddp_launch_job_lines": job_lines,
            "ddp_launch_progress": trainer_function(REPORT, "progress_line"),
            "ddp_launch_summary": trainer_function(REPORT, "summary_lines"),
        }
