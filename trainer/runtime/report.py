"""The job in words, for people: the follow's progress lines, a node's line for training-status.yml, the attempts on
record and the report of a job that ended badly. Reads what ``python -m trainer.runtime status`` prints
(trainer.runtime.nodestate.status); decides nothing (trainer.runtime.verdict and the hub do). Used on the
controller by roles/ddp_launch's plugins.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

SHOWN_METRICS = ("train_loss", "train_top1", "val_loss", "val_top1", "val_top5")
STEP_BUCKETS = 10  # the follow prints a line each tenth of an epoch at most


def _number(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def silent_members(status: Mapping[str, Any]) -> list[str]:
    """Members the hub has not heard within half the heartbeat timeout (only the hub's status knows; once the job has
    ended, members leave: nobody is missed)."""
    if (status.get("record") or {}).get("end"):
        return []
    watch = status.get("watch") or {}
    needed = (watch.get("quorum") or {}).get("needed")
    members = watch.get("members") or {}
    if needed is None:
        return []
    lease = max(1.0, float(watch.get("lease", 0) or 0))
    return sorted(name for name, m in members.items()
                  if m.get("heard_ago") is None or float(m["heard_ago"]) > lease)


def progress_key(status: Mapping[str, Any]) -> str:
    """What the follow prints a new line for: the node's state, the job's record, the epoch, a tenth of an epoch,
    members falling silent or coming back."""
    record = status.get("record") or {}
    progress = status.get("progress") or {}
    per_epoch = int(progress.get("steps_per_epoch") or 0)
    step = int(progress.get("step") or 0)
    bucket = (step % per_epoch) * STEP_BUCKETS // per_epoch if per_epoch else 0
    return "|".join(str(part) for part in (
        status.get("state"), record.get("term"), record.get("attempt"), record.get("phase"), progress.get("state"),
        progress.get("epoch"), bucket, ",".join(silent_members(status))))


def trainer_progress(progress: Mapping[str, Any] | None) -> str:
    """One line from the rank-0 trainer's status.json."""
    if not progress:
        return "starting: no progress from rank 0 yet"
    epochs = int(progress.get("epochs") or 0)
    per_epoch = int(progress.get("steps_per_epoch") or 0)
    step = int(progress.get("step") or 0)
    parts = [f"{progress.get('state', '?')}: epoch {progress.get('epoch', 0)}/{epochs or '?'} done"]
    if per_epoch:
        parts.append(f"step {step}/{per_epoch * epochs}")
    metrics = progress.get("metrics") or {}
    shown = [f"{key} {_number(metrics[key])}" for key in SHOWN_METRICS if key in metrics]
    if shown:
        parts.append(f"after epoch {metrics.get('epoch', '?')}: " + ", ".join(shown))
    if progress.get("clips_per_s"):
        parts.append(f"{float(progress['clips_per_s']):.1f} clips/s")
    if progress.get("eta_s") is not None and progress.get("state") == "running":
        parts.append(f"ETA {_duration(float(progress['eta_s']))}")
    if progress.get("message"):
        parts.append(str(progress["message"]))
    return "; ".join(parts)


def progress_line(status: Mapping[str, Any]) -> str:
    """The follow's line: the trainer's progress, the attempt, and who the hub hears."""
    record = status.get("record") or {}
    parts = [trainer_progress(status.get("progress"))]
    if record.get("attempt"):
        cause = (record.get("attempts") or [{}])[-1].get("cause") or {}
        parts.append(f"attempt {record['attempt']}, after {cause.get('node')} {cause.get('kind')} (detected in "
                     f"{cause.get('detect_s')} s)")
    if record.get("phase") == "stopping" and record.get("first_failure"):
        first = record["first_failure"]
        parts.append(f"stopping the attempt: {first['node']} failed first: {first['reason']}")
    elif record.get("phase") == "waiting":
        parts.append(f"waiting for {record.get('waiting') or 'the nodes'}")
    watch = status.get("watch") or {}
    members = watch.get("members") or {}
    silent = silent_members(status)
    if silent:
        parts.append("not heard: " + ", ".join(
            f"{name} ({'never' if members[name].get('heard_ago') is None else _number(members[name]['heard_ago'])}"
            f"{'' if members[name].get('heard_ago') is None else ' s'})" for name in silent))
    elif members and not record.get("end") and (status.get("progress") or {}).get("state") != "finished":
        parts.append(f"all {len(members)} nodes heard")
    return "; ".join(parts)


def attempt_lines(record: Mapping[str, Any] | None) -> list[str]:
    """Every restart on record: number, cause, node, time to detect, steps lost."""
    lines = []
    for entry in (record or {}).get("attempts", [])[1:]:
        cause = entry.get("cause") or {}
        lost = cause.get("failed_step")
        lines.append(
            f"attempt {entry['attempt']}: {cause.get('node')} {cause.get('kind')} ({cause.get('reason')}); detected "
            f"after {cause.get('detect_s')} s" + (f" at step {lost}" if lost is not None else "")
            + "; ranks " + ", ".join(f"{node}={rank}" for node, rank in (entry.get("assignment") or {}).items()))
    return lines


def describe(node: Mapping[str, Any]) -> str:
    """How a node's part of the job stands or ended, in words."""
    state = node.get("state")
    trainer = node.get("trainer") or {}
    if state == "unreachable":
        return "the controller cannot reach it (the job may still run there)"
    if state == "none":
        return "never started there"
    if state == "running":
        mode = {"hub": "the job's hub", "searching": "looking for the job's hub"}.get(str(node.get("mode")), "")
        what = f"trainer {trainer.get('state', 'idle')}"
        if trainer.get("state") == "running":
            what = f"trainer running (attempt {trainer.get('attempt')}, node rank {trainer.get('rank')})"
        return f"running; {what}" + (f"; {mode}" if mode else "")
    if state == "killed":
        return "its supervisor is gone without an end (killed, or the machine went away)"
    end = node.get("end") or {}
    return f"{state}: {end.get('reason', '')}".rstrip(": ")


def node_line(node: Mapping[str, Any]) -> str:
    """A node's line in training-status.yml."""
    text = f"{node.get('job') or '?'} on {node.get('node') or '?'}: {describe(node)}"
    if "changed" in node:  # what the stop verb did
        text += "; stopped now" if node["changed"] else "; nothing to stop"
    elif node.get("mode") == "hub":  # the job's progress, once: from the hub
        text += f"; rank 0 {trainer_progress(node.get('progress'))}"
    return text


def freshest(states: Mapping[str, Mapping[str, Any]]) -> Mapping[str, Any]:
    """The node state with the newest job record (the hub's, when it answered)."""
    def key(item: tuple[str, Mapping[str, Any]]) -> tuple[int, int, int]:
        record = item[1].get("record") or {}
        return (int(item[1].get("mode") == "hub"), int(record.get("term", -1)), int(record.get("version", -1)))

    return max(states.items(), key=key)[1] if states else {}


def end_report(states: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """``{state, first, message, restarts}`` of a job from every node's state: how it ended, the node that failed
    first, the words (with that node's log), and a line per restart."""
    best = freshest(states)
    record = best.get("record") or {}
    end = record.get("end") or best.get("end") or {}
    first = (end.get("first_failure") or record.get("first_failure") or {})
    lines = [f"The job {end.get('state', 'ended')}: {end.get('reason', 'no node knows why')}."]
    lines += [f"  {line}" for line in attempt_lines(record)]
    others = [f"{name}: {describe(s)}" for name, s in states.items() if name != first.get("node")]
    if others:
        lines.append("The nodes: " + "; ".join(others) + ".")
    failed = states.get(first.get("node", "")) or {}
    if failed.get("log_tail"):
        lines.append(f"Last lines of {first['node']}'s log ({failed.get('job_dir', '')}/train.log):")
        lines.extend(f"  {line}" for line in failed["log_tail"])
    return {"state": end.get("state", ""), "first": first.get("node", ""), "message": "\n".join(lines),
            "restarts": attempt_lines(record)}
