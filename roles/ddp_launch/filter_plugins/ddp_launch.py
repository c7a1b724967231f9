"""Filters of the ddp_launch role, all reading what files/jobctl.py prints about a node's part of a job: a progress
line from rank 0's news, a node's line for training-status.yml, and the verdict on a job that ended badly (which node
failed first).

Plain functions, so tests import this file directly; ``FilterModule`` only registers them for Ansible.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

# Metrics worth a place on the one progress line, in this order.
SHOWN_METRICS = ("train_loss", "train_top1", "val_loss", "val_top1", "val_top5", "lr")


def _number(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def trainer_progress(status: Mapping[str, Any] | None) -> str:
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


def watch_summary(watch: Mapping[str, Any] | None) -> str:
    """What rank 0's watch says of the nodes: all heard recently, or who has been silent."""
    nodes = (watch or {}).get("nodes") or {}
    if not nodes:
        return ""
    silent = {name: e for name, e in nodes.items() if e.get("heard_ago") is None or e["heard_ago"] > 30}
    if not silent:
        slowest = max(float(e["heard_ago"]) for e in nodes.values())
        return f"all {len(nodes)} nodes heard within {slowest:.0f} s"
    words = [f"{name} not yet heard" if e.get("heard_ago") is None else f"{name} silent {e['heard_ago']:.0f} s"
             for name, e in sorted(silent.items())]
    return "watch: " + ", ".join(words)


def progress(news: Mapping[str, Any] | None) -> str:
    """The follow's line from rank 0's news (jobctl state): the trainer's progress and the nodes' watch."""
    if not news:
        return "no news from rank 0 yet"
    parts = [trainer_progress(news.get("status"))]
    summary = watch_summary(news.get("watch"))
    if summary:
        parts.append(summary)
    return "; ".join(parts)


def swept_state(result: Mapping[str, Any]) -> dict[str, Any]:
    """A node's state from a registered jobctl call; a node the controller could not reach is 'unreachable'."""
    if result.get("unreachable"):
        return {"state": "unreachable", "detail": str(result.get("msg", "")).strip()}
    return json.loads(result["stdout"])


def describe(node: Mapping[str, Any]) -> str:
    """How a node's part of the job ended, in words."""
    state, rc = node.get("state"), node.get("rc")
    stopped = node.get("stopped_by") or {}
    if state == "unreachable":
        return "the controller cannot reach it (the job may still run there)"
    if state == "none":
        return "no training process was started there"
    if state == "running":
        return "still running"
    if state == "stopped":
        return f"stopped ({stopped.get('reason', 'stop-training.yml')})"
    if state == "killed":
        return "its processes ended without an exit status (killed by a signal)"
    if isinstance(rc, int) and rc < 0:
        return f"its trainer was killed by signal {-rc}"
    return f"its trainer exited with status {rc}"


def first_failure(states: Mapping[str, Mapping[str, Any]], root_news: Mapping[str, Any] | None) -> dict[str, Any]:
    """The node that failed first: rank 0's watch knows; without it, a node stopped because another failed first
    names that one; else a node that was killed or exited badly (a killed one first: it is the cause)."""
    watched = ((root_news or {}).get("watch") or {}).get("first_failure")
    if not watched:
        watched = next((((s.get("watch") or {}).get("first_failure")) for s in states.values()
                        if (s.get("watch") or {}).get("first_failure")), None)
    if watched:
        return {"node": watched["node"], "reason": watched["reason"]}
    bad = [(name, s) for name, s in states.items() if s.get("state") in ("failed", "killed", "unreachable", "none")
           or (s.get("state") == "stopped" and (s.get("stopped_by") or {}).get("by") == "watch")]
    if not bad:
        return {}

    def rank(item: tuple[str, Mapping[str, Any]]) -> tuple[int, float]:
        s = item[1]
        rc = s.get("rc")
        order = {"killed": 0, "unreachable": 1, "failed": 2}.get(str(s.get("state")), 3)
        return (0 if isinstance(rc, int) and rc < 0 else order, float(s.get("ended") or 0.0))

    name, state = min(bad, key=rank)
    return {"node": name, "reason": describe(state)}


def verdict(states: Mapping[str, Mapping[str, Any]], root_news: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``{failed, first, message}`` of a job that ended badly, from every node's state after the sweep."""
    first = first_failure(states, root_news)
    if not first:
        return {"failed": False, "first": "", "message": ""}
    lines = [f"Training failed on {first['node']}: {first['reason']}."]
    others = [f"{name}: {describe(s)}" for name, s in states.items() if name != first["node"]]
    if others:
        lines.append("The other nodes: " + "; ".join(others) + ".")
    running = [name for name, s in states.items() if s.get("state") == "running"]
    if running:
        lines.append(f"Still running on {', '.join(running)}: stop them with stop-training.yml.")
    tail = (states.get(first["node"]) or {}).get("log_tail") or []
    if tail:
        where = (states.get(first["node"]) or {}).get("job_dir", "")
        lines.append(f"Last lines of {first['node']}'s log ({where}/train.log):")
        lines.extend(f"  {line}" for line in tail)
    return {"failed": True, "first": first["node"], "message": "\n".join(lines)}


def job_line(node: Mapping[str, Any]) -> str:
    """One line about a job on a node: its state, and on rank 0 the trainer's progress and the watch's verdict."""
    name = (["?", *str(node.get("job_dir", "")).rstrip("/").split("/")])[-2]  # <jobs>/<job>/<node>
    state = str(node.get("state", "?"))
    if state == "running":
        text = f"{name}: running (pid {node.get('pid')})"
    elif state == "none":
        text = f"{name}: not started on this node"
    elif state in ("finished", "failed"):
        text = f"{name}: {state} (exit status {node.get('rc')})"
    else:
        text = f"{name}: {describe(node)}" if state == "stopped" else f"{name}: {state}"
    if "changed" in node:
        text += "; stopped now" if node["changed"] else "; nothing to stop"
    if node.get("rank") == 0 and node.get("status"):
        text += f"; rank 0 {trainer_progress(node['status'])}"
    failure = (node.get("watch") or {}).get("first_failure")
    if failure:
        text += f"; first failure: {failure['node']} ({failure['reason']})"
    elif state in ("failed", "killed") and node.get("log_tail"):
        text += f"; log ends: {node['log_tail'][-1]}"
    return text


class FilterModule:
    """Registers the functions above as Ansible filters."""

    def filters(self) -> dict[str, Callable[..., Any]]:
        return {
            "ddp_launch_progress": progress,
            "ddp_launch_swept_state": swept_state,
            "ddp_launch_verdict": verdict,
            "ddp_launch_first_failure": first_failure,
            "ddp_launch_job_line": job_line,
        }
