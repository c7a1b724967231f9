"""A job that knows its fleet, on real supervisors with stand-in trainers on loopback (tests/runtime/loopback.py):
the stand-ins take their steps through the real step clock (trainer/pace.py) and heartbeat, and a test slows one node
(its stand-in computes longer per step, every other node waits for it, as in data-parallel training). Seconds each;
the slow lane slows a real trainer with a cgroup's CPU quota on a local cluster (tests/cluster/test_stragglers.py).

- with a spare: the slow node is named within the window, every trainer checkpoints at a common step, the spare takes
  its rank, and the job trains at its old pace again;
- without a spare: named in the follow's line and the status, and the job trains on; two trainers killed on the way,
  and the job's goodput adds up to its wall time, in the status and the record.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.runtime.loopback import NET, Job, loopback, wait_until
from trainer.runtime import report
from trainer.runtime.job.record import EndState, Kind

__all__ = ["loopback"]
STEP_S = 0.1  # the stand-in's step
RULES = {"threshold": 0.7, "window": 3.0, "action": "auto", "cooldown": 0.0}


def steps_per_s(job: Job, seconds: float) -> float:
    """Rank 0's (n0's) steps per second over the next ``seconds``."""
    first, began = job.step("n0"), time.monotonic()
    time.sleep(seconds)
    return (job.step("n0") - first) / (time.monotonic() - began)


def slow(path: Path, node: int, factor: float) -> float:
    """Node ``node`` computes ``factor`` times as long per step from now on (the stand-ins read the file); when."""
    path.write_text(json.dumps({"ip": f"{NET}.{10 + node}", "factor": factor}))
    return time.time()


def kill_a_trainer(job: Job, node: str) -> None:
    """Kill ``node``'s trainer once its attempt trains and its members have reported what it spent (a few report
    periods: an attempt killed before that has nothing on record), and wait for the next attempt."""
    attempt = job.record().attempt
    if attempt > 0:  # rank 0 (n0) records a restarted attempt after its first step
        wait_until(lambda: (told := [a for a in job.attempts("n0") if a["attempt"] == attempt])
                   and job.step("n0") >= told[0]["resumed_step"] + 5, 60, f"attempt {attempt} training", job.logs)
    time.sleep(3 * job.plans["n0"].timings.report_every)
    wait_until(lambda: job.processes(node, trainers_only=True), 60, f"{node}'s trainer", job.logs)
    job.signal(node, signal.SIGKILL, trainers_only=True)
    wait_until(lambda: job.record().attempt > attempt, 60, "the next attempt", job.logs)


def test_a_slow_node_is_named_and_swapped_for_the_spare_at_a_checkpoint(loopback: Callable[..., Job],
                                                                        tmp_path: Path) -> None:
    slowness = tmp_path / "slow.json"
    job = loopback(2, 1, steps=400, stragglers=RULES,
                   env={"STANDIN_SLOW": str(slowness), "STANDIN_MORE_STEPS": "60", "STANDIN_CKPT_STEPS": "1000"})
    job.start_all()
    wait_until(lambda: job.step("n0") >= 15, 60, "rank 0 at step 15", job.logs)
    before = steps_per_s(job, 2.0)
    slowed_at = slow(slowness, 1, 5.0)
    record = wait_until(lambda: "n1" in (r := job.record()).stragglers and r, 60, "n1 named", job.logs)
    named = record.stragglers["n1"]
    span = job.plans["n0"].stragglers.span(job.plans["n0"].timings.report_every)
    assert RULES["window"] <= named.named_at - slowed_at <= RULES["window"] + 2 * span + 3, (named, slowed_at)
    assert named.pace < 0.5 and named.replaced_by == "n2", named
    wait_until(lambda: (told := job.attempts("n0")) and job.step("n0") > told[0]["resumed_step"] + 5, 60,
               "the next attempt training", job.logs)
    after = steps_per_s(job, 2.0)
    assert after >= 0.8 * before, (before, after)  # back to its pace: the slow node is out
    record = job.ended()
    assert record.end is not None and record.end.state == EndState.FINISHED, job.logs()
    assert record.assignment == {"n0": 0, "n2": 1} and record.restarts == 1
    cause = record.cause
    assert cause is not None and (cause.node, cause.kind) == ("n1", Kind.SLOW)
    # replaced at a checkpoint every rank took at the same step: the spare's attempt lost no step
    [attempt] = job.attempts("n0")
    assert attempt["steps_lost"] == 0 and attempt["resumed_step"] == cause.failed_step, attempt
    assert "the trainer exited with status 75" in job.log("n1")  # it checkpointed when asked, as in a preemption
    assert "n1 is a straggler: it trained at" in job.log("n0") and record.stragglers["n1"].replaced_by == "n2"


def test_without_a_spare_a_slow_node_is_named_in_the_follow_and_the_status_and_goodput_adds_up(
        loopback: Callable[..., Job], tmp_path: Path) -> None:
    slowness = tmp_path / "slow.json"
    job = loopback(2, steps=60, stragglers=RULES,
                   env={"STANDIN_SLOW": str(slowness), "STANDIN_MORE_STEPS": "30", "STANDIN_CKPT_STEPS": "5"})
    job.start_all()
    wait_until(lambda: job.step("n0") >= 10, 60, "rank 0 at step 10", job.logs)
    slow(slowness, 1, 3.0)
    wait_until(lambda: "n1" in job.record().stragglers, 60, "n1 named", job.logs)
    hub = job.status("n0")
    said = "stragglers: n1 at 0."
    assert said in report.progress_line(hub) and "trains on (no spare is free to replace it)" in (
        report.progress_line(hub)), report.progress_line(hub)  # the follow's line
    assert any(line.startswith(said) for line in report.summary_lines(hub)), report.summary_lines(hub)  # the status
    slowness.unlink()  # two failures on the way: n1's trainer killed, then n0's
    for node in ("n1", "n0"):
        kill_a_trainer(job, node)
    record = job.ended()
    assert record.end is not None and record.end.state == EndState.FINISHED and record.restarts == 2, job.logs()
    goodput = record.goodput
    assert goodput is not None and goodput.failures == 2 and goodput.restart_s > 0
    # a killed trainer is seen by its own agent at once: detection may round to 0.0, but it is what the causes say
    causes = [a.cause for a in record.attempts if a.cause is not None]
    assert goodput.detection_s == pytest.approx(sum(c.detected_at - c.at for c in causes), abs=0.1), (goodput, causes)
    parts = (goodput.trained_s, goodput.startup_s, goodput.detection_s, goodput.restart_s, goodput.recomputed_s,
             goodput.checkpoint_s, goodput.data_s, goodput.other_s)
    assert sum(parts) == pytest.approx(goodput.wall_s, abs=0.5), goodput
    assert goodput.trained_s > goodput.other_s >= -0.5 and goodput.startup_s > 0, goodput
    assert len(record.spent) == 3  # what each attempt's trainers spent, on record
    ended = report.end_report({name: job.status(name) for name in job.names})
    [line] = [line for line in ended["summary"] if line.startswith("goodput ")]
    assert " trained; the rest: start-up " in line and "2 failure(s)" in line, ended["summary"]
