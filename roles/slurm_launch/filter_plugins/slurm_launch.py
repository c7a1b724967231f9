"""Filters of the slurm_launch role, reading what the login host's runtime prints about a Slurm job
(``python -m trainer.runtime slurm-status``). The words are the trainer's (trainer/runtime/report.py); this file only
adds Slurm's view to them.

``FilterModule`` registers the plain functions below for Ansible.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from ansible_collections.vidcluster.launcher.plugins.plugin_utils.trainer import trainer_module

REPORT = "runtime.report"  # trainer/runtime/report.py: the words of every node's and job's state


def launch_file(kind: str) -> str:
    """The launch's file of this kind (description, experiment) in the login host's folder of the job, as
    trainer/runtime/slurm/account.py names it."""
    account = trainer_module("runtime.slurm.account")
    return {"description": account.DESCRIPTION_FILE, "experiment": account.EXPERIMENT_FILE}[kind]


def queue_line(status: Mapping[str, Any]) -> str:
    """Slurm's view of the job: its id, state, nodes, run time and limit, and how many times it was requeued."""
    slurm = status.get("slurm") or {}
    runs = len(slurm.get("allocations") or [])
    text = f"Slurm job {slurm.get('job_id')}: {slurm.get('state')}"
    if slurm.get("reason") not in (None, "", "None"):
        text += f" ({slurm['reason']})"
    if slurm.get("nodes") and slurm.get("state") == "RUNNING":
        text += f" on {slurm['nodes']} for {slurm.get('run_time')} of {slurm.get('time_limit')}"
    return text + f"; {runs} allocation(s), requeued {slurm.get('restarts', 0)} time(s)"


def job_lines(stdout: str) -> list[str]:
    """training-status.yml's lines on a Slurm site: per job, Slurm's view, the job's state and progress, each node of
    its latest allocation, and every restart on record."""
    report = trainer_module(REPORT)
    lines = []
    for text in stdout.splitlines():
        if not text.strip():
            continue
        status = json.loads(text)
        if status.get("state") == "none":
            continue
        lines.append(f"{status.get('job')}: {queue_line(status)}")
        lines.append(f"{status.get('job')}: {status['state']}; {report.progress_line(status)}")
        lines += [report.node_line(node) for node in (status.get("nodes") or {}).values()]
        lines += report.attempt_lines(status.get("record"))
    return lines or ["no job here"]


def end_report(status: Mapping[str, Any]) -> dict[str, Any]:
    """``{state, first, message, restarts, rank0}`` of a Slurm job that ended: the runtime's end report of its
    latest allocation's nodes, Slurm's view first."""
    nodes = dict(status.get("nodes") or {})
    ended = (trainer_module(REPORT).end_report(nodes) if nodes
             else {"state": "", "first": "", "message": "", "restarts": []})
    end = status.get("end") or {}
    message = [queue_line(status) + ".", f"The job {end.get('state', status.get('state'))}: {end.get('reason', '')}"]
    message += [line for line in ended["message"].splitlines()[1:]]
    record = status.get("record") or {}
    rank0 = next((node for node, rank in (record.get("assignment") or {}).items() if rank == 0), "")
    return {**ended, "state": end.get("state", status.get("state")), "message": "\n".join(message),
            "rank0": nodes.get(rank0, {})}


class FilterModule:
    """Registers the functions above as Ansible filters."""

    def filters(self) -> dict[str, Callable[..., Any]]:
        return {"slurm_launch_job_lines": job_lines, "slurm_launch_end_report": end_report,
                "slurm_launch_file": launch_file}
