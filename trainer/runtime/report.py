"""The job in words, for people: the follow's progress lines, a node's line for training-status.yml, the attempts on
record and the report of a job that ended badly. Reads what ``python -m trainer.runtime status`` prints
(trainer.runtime.host.nodestate.status); decides nothing (trainer.runtime.job.verdict and the hub do). Used on the
controller by roles/ddp_launch's plugins.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

from trainer.runtime import schema
from trainer.runtime.host.channel import PHASES
from trainer.runtime.job.record import (
    Cause,
    End,
    EndState,
    Goodput,
    JobRecord,
    Kind,
    NodeTimeline,
    Phase,
    RecordError,
    WorldChange,
)
from trainer.runtime.schema import SchemaError

SHOWN_METRICS = ("train_loss", "train_top1", "val_loss", "val_top1", "val_top5")
STEP_BUCKETS = 10  # the follow prints a line each tenth of an epoch at most
STOPPED_STATES = ("failed", "preempted", "stopped")  # a trainer's status.json once its attempt is over


def _number(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def record_of(status: Mapping[str, Any]) -> JobRecord | None:
    """The job's record in a node's state (None when the node holds none this runtime can read)."""
    data = status.get("record")
    if data is None:
        return None
    try:
        return JobRecord.read(data, "the node's record")
    except RecordError:
        return None


def job_end(status: Mapping[str, Any]) -> End | None:
    """How the job ended, as the node's record says (None: not ended, or no record)."""
    record = record_of(status)
    return record.end if record is not None else None


def hub_of(status: Mapping[str, Any]) -> str:
    """The job's hub, as the node's record names it ('' without a record)."""
    record = record_of(status)
    return record.hub if record is not None else ""


def silent_members(status: Mapping[str, Any]) -> list[str]:
    """Members the hub has not heard within the lease (only the hub's status knows; once the job has ended, members
    leave: nobody is missed)."""
    if job_end(status) is not None:
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
    members falling silent or coming back, a straggler named or swapped."""
    record = record_of(status)
    progress = status.get("progress") or {}
    per_epoch = int(progress.get("steps_per_epoch") or 0)
    step = int(progress.get("step") or 0)
    bucket = (step % per_epoch) * STEP_BUCKETS // per_epoch if per_epoch else 0
    place = (record.term, record.attempt, record.phase.value) if record is not None else (None, None, None)
    return "|".join(str(part) for part in (
        status.get("state"), *place, progress.get("state"), progress.get("epoch"), bucket,
        ",".join(silent_members(status)), straggler_words(record) if record is not None else ""))


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


def _attempt(record: JobRecord) -> str:
    """'attempt 2 of 4' (attempts count from 1: the launch's, one per restart allowed, and one per grow so far: a grow
    counts toward no limit)."""
    grows = sum(1 for entry in record.attempts if _joined(entry.cause))
    return f"attempt {record.attempt + 1} of {record.max_restarts + 1 + grows}"


def _joined(cause: Cause | None) -> bool:
    """The attempt began because nodes joined its world (a grow, no failure)."""
    return cause is not None and cause.kind == Kind.JOINED


def job_line(record: JobRecord, progress: Mapping[str, Any] | None) -> str:
    """What happens to the job, in the runtime's words, when it is more than the trainer's progress: an attempt
    stopping, the next one starting, a wait, a bad end ('' when the trainer's progress says it all)."""
    first, cause = record.first_failure, record.cause
    if record.end is not None:
        return "" if record.end.state == EndState.FINISHED else f"the job {record.end.state}: {record.end.reason}"
    if record.phase == Phase.STOPPING and first is not None:
        detected = (f", detected in {record.detected_at - first.at:.1f} s" if record.detected_at is not None
                    else "")
        return f"stopping ({_attempt(record)}): {first.node} {first.kind}{detected}: {first.reason}"
    if record.phase == Phase.WAITING:
        return f"waiting ({_attempt(record)}): {record.waiting or 'for the nodes'}"
    if cause is not None and (progress or {}).get("state") in (None, "starting", *STOPPED_STATES):
        if _joined(cause):
            return f"growing ({_attempt(record)}): {cause.reason}"
        return f"restarting ({_attempt(record)}): {cause.node} {cause.kind}, detected in {cause.detect_s:.1f} s"
    return ""


def progress_line(status: Mapping[str, Any]) -> str:
    """The follow's line: what happens to the job (the trainer's progress, or the runtime's words while an attempt
    stops or starts), the attempt, and who the hub hears."""
    record = record_of(status)
    progress = status.get("progress")
    said = job_line(record, progress) if record is not None else ""
    parts = [said or trainer_progress(progress)]
    if not said and record is not None and record.cause is not None:
        cause = record.cause
        after = "joined" if _joined(cause) else f"{cause.kind} (detected in {cause.detect_s:.1f} s)"
        parts.append(f"{_attempt(record)}, after {cause.node} {after}")
    if record is not None and record.stragglers:
        parts.append(straggler_words(record))
    if record is not None and record.world_changes:
        parts.append(world_words(record))
    watch = status.get("watch") or {}
    members = watch.get("members") or {}
    silent = silent_members(status)
    if silent:
        parts.append("not heard: " + ", ".join(
            f"{name} ({'never' if members[name].get('heard_ago') is None else _number(members[name]['heard_ago'])}"
            f"{'' if members[name].get('heard_ago') is None else ' s'})" for name in silent))
    elif members and (record is None or record.end is None) and (progress or {}).get("state") != "finished":
        parts.append(f"all {len(members)} nodes heard")
    return "; ".join(parts)


def attempt_lines(record: Mapping[str, Any] | JobRecord | None) -> list[str]:
    """Every restart on record: number, cause, node, time to detect, steps lost, the nodes that left or joined the
    world."""
    if record is not None and not isinstance(record, JobRecord):
        record = record_of({"record": record})
    lines = []
    changes = {change.attempt: change for change in record.world_changes} if record is not None else {}
    for entry in record.attempts[1:] if record is not None else ():
        cause = entry.cause
        if cause is None:
            continue
        lost = cause.failed_step
        change = changes.get(entry.attempt)
        said = ("the world grew" if _joined(cause) else
                f"{cause.node} {cause.kind} ({cause.reason}); detected after {cause.detect_s} s")
        lines.append(
            f"attempt {entry.attempt}: {said}"
            + (f" at step {lost}" if lost is not None else "")
            + (f"; {change_words(change, record)}" if change is not None else "")
            + "; ranks " + ", ".join(f"{node}={rank}" for node, rank in entry.assignment.items()))
    return lines


def change_words(change: WorldChange, record: JobRecord) -> str:
    """'n1 left the world (lost, no spare): 3 nodes -> 2, accumulation 1 -> 2', 'n1 joined the world: 2 nodes -> 3,
    accumulation 2 -> 1' (the accumulation as the trainers said it, '?' for an attempt whose nodes have not)."""
    sizes = f"{change.before} nodes -> {change.after}"
    before, after = accumulation(record, change.attempt - 1), accumulation(record, change.attempt)
    if before is not None or after is not None:
        sizes += f", accumulation {'?' if before is None else before} -> {'?' if after is None else after}"
    if change.cause == Kind.JOINED:
        return f"{', '.join(change.joined)} joined the world: {sizes}"
    why = "lost, no spare" if change.cause == Kind.LOST else "a straggler, dropped"
    return f"{', '.join(change.left)} left the world ({why}): {sizes}"


def accumulation(record: JobRecord, attempt: int) -> int | None:
    """The micro-batches of each optimizer step in ``attempt``, as its nodes' trainers said (None: none has yet)."""
    said = [t.micro_batches for entry in record.attempts if entry.attempt == attempt for t in entry.nodes.values()
            if t.micro_batches is not None]
    return max(said, default=None)


def world_words(record: JobRecord) -> str:
    """'world: 3 of the launch's 3 nodes (n1 left at attempt 1; n1 joined at attempt 2)' ('' when it never
    changed)."""
    if not record.world_changes:
        return ""
    launched = len(record.attempts[0].assignment)
    changes = "; ".join(f"{', '.join(c.joined)} joined at attempt {c.attempt}" if c.cause == Kind.JOINED
                        else f"{', '.join(c.left)} left at attempt {c.attempt}" for c in record.world_changes)
    return f"world: {len(record.assignment)} of the launch's {launched} nodes ({changes})"


def _since(later: float | None, earlier: float | None) -> str:
    """'+1.2' seconds, or '?' when either end is not on record."""
    return "?" if later is None or earlier is None else f"+{max(0.0, later - earlier):.1f}"


def node_phases(node: str, timeline: NodeTimeline, decided: float) -> str:
    """'node1 standby (why not in place): started +0.1, imported +0.0, group +1.2, checkpoint +0.3, first step +0.5':
    each phase after the one before, the start after the hub's decision; then, if so, the pause of a trainer that went
    on in place (its last step before to its first step), why its trainer had to be killed after the stop grace, and
    its flight recorder's dumps."""
    how = timeline.start.value + (f" ({timeline.fallback})" if timeline.fallback else "")
    times = [decided, timeline.started, timeline.imported, timeline.group, timeline.checkpoint, timeline.first_step]
    steps = [f"{name.replace('_', ' ')} {_since(later, earlier)}"
             for name, earlier, later in zip(PHASES, times, times[1:], strict=False)]
    ended = []
    if timeline.step_before is not None and timeline.first_step is not None:  # it went on in place
        ended.append(f"paused {timeline.first_step - timeline.step_before:.1f} s since its last step before")
    ended += [timeline.killed] if timeline.killed else []  # the stop grace ran out
    ended += [f"flight recorder: {', '.join(timeline.flight)}"] if timeline.flight else []
    return f"{node} {how}: {', '.join(steps + ended)}"


def timeline_lines(record: Mapping[str, Any] | JobRecord | None) -> list[str]:
    """Every attempt's timeline, in seconds, each phase after the one before: for a restart, the failure, the hub
    naming it, the attempt over on every node (trainers exited or parked), the restart decided; then each node's
    trainer (how it started, why not in place) up to its first step, and how long after the failure every node
    trained again."""
    if record is not None and not isinstance(record, JobRecord):
        record = record_of({"record": record})
    lines = []
    for entry in record.attempts if record is not None else ():
        cause = entry.cause
        if cause is None:
            head = "the launch"
        elif _joined(cause):  # decided at once, no stop: nothing to time before the nodes
            head = cause.reason
        else:
            head = (f"failure, named {_since(cause.detected_at, cause.at)}, over on every node "
                    f"{_since(entry.stopped_at, cause.detected_at)}, "
                    f"decided {_since(entry.started_at, entry.stopped_at)}")
        parts = [node_phases(node, timeline, entry.started_at) for node, timeline in sorted(entry.nodes.items())]
        steps = [t.first_step for t in entry.nodes.values()]
        if cause is not None and steps and None not in steps and len(steps) == len(entry.assignment):
            event = "the grow" if _joined(cause) else "the failure"
            parts.append(f"training again {max(s for s in steps if s is not None) - cause.at:.1f} s after {event}")
        lines.append(f"attempt {entry.attempt} (s): {'; '.join([head, *parts])}")
    return lines


def straggler_words(record: JobRecord) -> str:
    """'stragglers: n1 at 0.21x the others' pace for 62 s, replaced by n2' ('' when none was named)."""
    said = []
    for node, named in record.stragglers.items():
        if named.replaced_by:
            what = f"replaced by {named.replaced_by}"
        elif named.replaced_at is not None:  # dropped (its note says so), or its swap under way
            what = named.note or "being swapped at a checkpoint"
        else:
            what = f"trains on ({named.note})" if named.note else "trains on"
        said.append(f"{node} at {named.pace:.2f}x the others' pace for {named.slow_for:.0f} s, {what}")
    return f"stragglers: {'; '.join(said)}" if said else ""


def goodput_of(status: Mapping[str, Any]) -> Goodput | None:
    """The job's goodput: the record's once the job ended, the hub's so far while it runs (None: not known here)."""
    record = record_of(status)
    if record is not None and record.end is not None:
        return record.goodput
    data = (status.get("watch") or {}).get("goodput")
    if data is None:
        return None
    try:
        return schema.parse(Goodput, data, "the hub's goodput")
    except SchemaError:
        return None


def goodput_lines(goodput: Goodput | None) -> list[str]:
    """The job's goodput in words: what trained, what was lost where (the parts add up to the wall time), and
    Young/Daly's checkpoint interval when the configured one is far from it."""
    if goodput is None or goodput.wall_s <= 0:
        return []
    share = 100.0 * goodput.trained_s / goodput.wall_s
    restarts = _duration(goodput.restart_s) + (
        f" (world changes {_duration(goodput.world_change_s)})" if goodput.world_change_s > 0 else "")
    lost = ", ".join(f"{words} {seconds}" for words, seconds in (
        ("start-up", _duration(goodput.startup_s)), ("detection", _duration(goodput.detection_s)),
        ("restarts", restarts), ("recomputed steps", _duration(goodput.recomputed_s)),
        ("checkpoint stalls", _duration(goodput.checkpoint_s)), ("data waits", _duration(goodput.data_s)),
        ("other (evaluation, epoch ends)", _duration(goodput.other_s))))
    lines = [f"goodput {share:.1f}%: {_duration(goodput.trained_s)} of {_duration(goodput.wall_s)} trained; "
             f"the rest: {lost}; {goodput.failures} failure(s)"]
    if goodput.suggestion:
        lines.append(f"checkpoints: {goodput.suggestion}")
    return lines


def summary_lines(status: Mapping[str, Any]) -> list[str]:
    """A running job's attempts (each one's timeline), stragglers and goodput so far, from its hub's status
    (training-status.yml)."""
    record = record_of(status)
    if record is None:
        return []
    named, world = straggler_words(record), world_words(record)
    return [*attempt_lines(record), *timeline_lines(record), *([named] if named else []), *([world] if world else []),
            *goodput_lines(goodput_of(status))]


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
        record = record_of(item[1])
        newest = (record.term, record.version) if record is not None else (-1, -1)
        return (int(item[1].get("mode") == "hub"), *newest)

    return max(states.items(), key=key)[1] if states else {}


def rank0_of(states: Mapping[str, Mapping[str, Any]]) -> str:
    """The node that had rank 0 in the job's last attempt, as the freshest record says ('' without one)."""
    record = record_of(freshest(states))
    return (record.rank0 or "") if record is not None else ""


def end_report(states: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """``{state, first, message, restarts, summary}`` of a job from every node's state: how it ended, the node that
    failed first, the words (with that node's log, the stragglers and the goodput), a line per restart, and the
    stragglers' and goodput's lines."""
    best = freshest(states)
    record = record_of(best)
    end = record.end if record is not None else None
    if end is None and best.get("end"):  # a node that ended without a record of the end (its own stop)
        with contextlib.suppress(SchemaError):
            end = schema.parse(End, best["end"], "the node's end")
    first = end.first_failure if end is not None else None
    if first is None and record is not None:
        first = record.first_failure
    lines = [f"The job {end.state if end else 'ended'}: {end.reason if end else 'no node knows why'}."]
    lines += [f"  {line}" for line in attempt_lines(record) + timeline_lines(record)]
    said = [straggler_words(record), world_words(record)] if record is not None else []
    summary = [line for line in said if line] + goodput_lines(goodput_of(best))
    lines += [f"  {line}" for line in summary]
    first_node = first.node if first is not None else ""
    others = [f"{name}: {describe(s)}" for name, s in states.items() if name != first_node]
    if others:
        lines.append("The nodes: " + "; ".join(others) + ".")
    failed = states.get(first_node) or {}
    if failed.get("log_tail"):
        lines.append(f"Last lines of {first_node}'s log ({failed.get('job_dir', '')}/train.log):")
        lines.extend(f"  {line}" for line in failed["log_tail"])
    return {"state": end.state.value if end else "", "first": first_node, "message": "\n".join(lines),
            "restarts": attempt_lines(record), "summary": summary}
