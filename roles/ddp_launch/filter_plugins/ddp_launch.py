"""Filters of the ddp_launch role: a progress line from the trainer's status file, and the verdict on a job from
every node's state (as printed by files/jobctl.py).

Plain functions, so tests import this file directly; ``FilterModule`` only registers them for Ansible.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

# Metrics worth a place on the one progress line, in this order.
SHOWN_METRICS = ("train_loss", "train_top1", "val_loss", "val_top1", "val_top5", "lr")
# Node states that end a job badly (see jobctl.py); "none" means the process never started there.
BAD_STATES = ("failed", "killed", "stopped", "none")


def _number(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def progress(status: Mapping[str, Any] | None) -> str:
    """One line from the trainer's status.json: state, epoch, step, the last epoch's metrics."""
    if not status:
        return "starting: no status from rank 0 yet"
    epochs = int(status.get("epochs") or 0)
    per_epoch = int(status.get("steps_per_epoch") or 0)
    step = int(status.get("step") or 0)
    parts = [f"{status.get('state', '?')}: epoch {status.get('epoch', 0)}/{epochs or '?'} done"]
    if per_epoch:
        parts.append(f"step {step}/{per_epoch * epochs} ({per_epoch}/epoch)")
    metrics = status.get("metrics") or {}
    shown = [f"{key} {_number(metrics[key])}" for key in SHOWN_METRICS if key in metrics]
    if shown:
        parts.append(f"after epoch {metrics.get('epoch', '?')}: " + ", ".join(shown))
    if status.get("world_size"):
        parts.append(f"{status['world_size']} processes")
    if status.get("message"):
        parts.append(str(status["message"]))
    return "; ".join(parts)


def describe(node: Mapping[str, Any]) -> str:
    """How a node's process ended, in words."""
    state, rc = node.get("state"), node.get("rc")
    if state == "unreachable":
        return "the node stopped answering over SSH"
    if state == "none":
        return "no training process was started there"
    if state == "stopped":
        return "its process was stopped (stop-training.yml)"
    if state == "killed":
        return "its process group ended without an exit status (killed by a signal)"
    if isinstance(rc, int) and rc < 0:
        return f"its training process was killed by signal {-rc}"
    return f"its training process exited with status {rc}"


def _external_first(node: Mapping[str, Any]) -> tuple[int, float]:
    # A node that was killed, stopped or lost is the cause; the others' errors ("connection closed by peer")
    # are its consequences. Among equals, whoever ended first.
    rc = node.get("rc")
    external = node.get("state") in ("unreachable", "killed", "stopped", "none") or (isinstance(rc, int) and rc < 0)
    return (0 if external else 1, float(node.get("ended") or 0.0))


def verdict(hosts: Sequence[str], polls: Mapping[str, Any], reachable: Sequence[str]) -> dict[str, Any]:
    """``{finished, failed, first, message}`` of a job from each node's last state (``polls``: host -> state)."""
    nodes = []
    for host in hosts:
        node = dict(polls.get(host) or {"state": "none"})
        if host not in reachable:
            node["state"] = "unreachable"
        nodes.append({"host": host, **node})
    bad = sorted((n for n in nodes if n["state"] in (*BAD_STATES, "unreachable")), key=_external_first)
    if not bad:
        return {"finished": all(n["state"] == "finished" for n in nodes), "failed": False, "first": "", "message": ""}
    first = bad[0]
    lines = [f"Training failed on {first['host']}: {describe(first)}."]
    if len(bad) > 1:
        lines.append("Then: " + "; ".join(f"{n['host']}: {describe(n)}" for n in bad[1:]) + ".")
    lines.append("The job has been stopped on every node.")
    tail = first.get("log_tail") or []
    if tail:
        lines.append(f"Last lines of {first['host']}'s log ({first.get('job_dir', '')}/train.log):")
        lines.extend(f"  {line}" for line in tail)
    return {"finished": False, "failed": True, "first": first["host"], "message": "\n".join(lines)}


def job_line(node: Mapping[str, Any]) -> str:
    """One line about a job on a node: its state (pid, exit status) and, on rank 0, the trainer's progress."""
    name = str(node.get("job_dir", "?")).rstrip("/").rsplit("/", 1)[-1]
    state = str(node.get("state", "?"))
    if state == "running":
        text = f"{name}: running (pid {node.get('pid')})"
    elif state == "none":
        text = f"{name}: not started on this node"
    elif state in ("finished", "failed"):
        text = f"{name}: {state} (exit status {node.get('rc')})"
    else:
        text = f"{name}: {state}"
    if "changed" in node:
        text += "; stopped now" if node["changed"] else "; nothing to stop"
    if node.get("status"):
        text += f"; rank 0 {progress(node['status'])}"
    elif state in ("failed", "killed") and node.get("log_tail"):
        text += f"; log ends: {node['log_tail'][-1]}"
    return text


class FilterModule:
    """Registers the functions above as Ansible filters."""

    def filters(self) -> dict[str, Callable[..., Any]]:
        return {"ddp_launch_progress": progress, "ddp_launch_verdict": verdict, "ddp_launch_job_line": job_line}
