"""Filters of the ddp_launch role, reading what the nodes' runtime prints about their part of a job
(``python -m trainer.runtime status``). The words are the trainer's (trainer/runtime/report.py); this file only
adapts them to Ansible's results.

``FilterModule`` registers the plain functions below for Ansible.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from ansible_collections.vidcluster.launcher.plugins.plugin_utils.trainer import trainer_module

report = trainer_module("runtime.report")


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
    return report.hub_of(report.freshest(states))


def job_lines(stdout: str) -> list[str]:
    """training-status.yml's lines for one node: one per job (the runtime prints one JSON object per job)."""
    return [report.node_line(json.loads(line)) for line in stdout.splitlines() if line.strip()] or ["no job here"]


class FilterModule:
    """Registers the functions above as Ansible filters."""

    def filters(self) -> dict[str, Callable[..., Any]]:
        return {
            "ddp_launch_node_states": node_states,
            "ddp_launch_hub": hub,
            "ddp_launch_rank0": report.rank0_of,
            "ddp_launch_end_report": report.end_report,
            "ddp_launch_job_lines": job_lines,
            "ddp_launch_progress": report.progress_line,
            "ddp_launch_summary": report.summary_lines,
        }
