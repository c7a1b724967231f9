"""A lost node that answers again rejoins the running job (issue 37): how many of the world's steps, and how many
seconds, pass between the hub hearing it and its first step.

    .venv/bin/python -m bench.rejoin [--repeats 3]     (root: a 3-node local cluster; about 4 minutes a round)

The job: configs/i3d_cpu_test.yaml with bench/restarts.py's model and clips (r3d_18 on 56 px) on the three nodes of a
local cluster, no spare, vidcluster_min_nodes 2, one clip per process and step (several optimizer steps an epoch, so
that an epoch's end is not every step), the trainers' sample log on (LOG.SAMPLE_LOG), a heartbeat timeout of
HEARTBEAT_S. Each round: in epoch FREEZE_EPOCH node2's machine hangs (every process of its namespace stopped) until the
world has shrunk to node0 and node1 (the record's first world change) and the smaller world has trained SMALLER_STEPS
steps; then it answers again (SIGCONT). Its supervisor finds the hub, the hub grows the world back (the record's second
world change: ``at`` is the hub's decision) and node2 trains again from a peer's memory.

Every line of the sample logs of rank 0 (node0) and of node2 is stamped as it appears (bench/elastic.py's Watcher,
every 20 ms). Per round:
  - answered -> decided: the thaw to the hub's decision, s (node2's supervisor notices it lost the hub while it hung,
    its trainer leaves the old attempt, the supervisor finds the hub, which welcomes it back);
  - steps after the decision: node2's first step less the last step rank 0 had taken at the decision: the world's
    steps until node2 trains, its first one included (goal, issue 37: at most 2);
  - steps after the thaw: the same, counted from the thaw;
  - decided -> trains: the decision to node2's first step, s;
  - pause: the world's last step before the grow to its first step after it, s, against the step time (rank 0's
    median between two steps of one attempt);
  - from memory: every attempt after the first went on from a peer's memory (metrics.jsonl), none read a checkpoint;
  - accumulation back: the run's log says the accumulation went back to the launch's (2 -> 1).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.elastic import Watcher
from bench.local import REPO, signal_node, training_cluster
from bench.restarts import JOB as RESTARTS_JOB
from bench.restarts import job_dir, job_record, launch, read, run_file
from trainer.runtime.contract import METRICS_FILE, STATUS_FILE
from trainer.runtime.job.record import Kind

CLUSTER = "brejoin"
EPOCHS = 8
FREEZE_EPOCH = 2
SMALLER_STEPS = 4  # the smaller world trains this many steps before node2 answers: its way back alone is measured
HEARTBEAT_S = 10
TIMEOUT_S = 600
GOAL_STEPS = 2
JOINER_NODE = 2
# bench/restarts.py's model and clips (r3d_18, 56 px: a step of about 1.8 s here, not i3d_tiny's 0.02 s, which is
# shorter than the hub's word takes to reach a trainer), one clip per process and step.
JOB = {"CONFIG": {"TRAIN": {"EPOCH_NUM": EPOCHS, "BATCH_SIZE": 1}, "LOG": {"SAMPLE_LOG": True},
                  "DATA": RESTARTS_JOB["CONFIG"]["DATA"], "MODEL": RESTARTS_JOB["CONFIG"]["MODEL"]}}


@dataclass(frozen=True)
class Rejoin:
    """One round's figures (see the module docstring)."""

    answered_s: float
    steps_after_decision: int
    steps_after_thaw: int
    trains_s: float
    pause_s: float
    step_s: float | None  # the median of rank 0's step times (None: it never took two steps in a row)
    from_memory: bool  # no attempt read a checkpoint
    accumulation_back: bool  # the log says the accumulation went back to the launch's


def measure(records: list[dict[str, Any]], thawed: float, decided: float, attempt: int, joiner: int, *,
            from_memory: bool, accumulation_back: bool) -> Rejoin:
    """The figures from stamped sample records (``step``, ``attempt``, ``rank``, ``t``): ``attempt`` is the grown
    world's, ``joiner`` the rank node2 trains as in it; ``from_memory`` and ``accumulation_back`` as the run's
    metrics and log say."""
    rank0 = sorted((r for r in records if r["rank"] == 0), key=lambda r: r["t"])
    joined = [r for r in records if r["attempt"] == attempt and r["rank"] == joiner]
    if not joined:
        raise SystemExit("bench/rejoin.py: the joiner never trained in the grown world")
    first = min(joined, key=lambda r: r["t"])

    def last_step(at: float) -> int:
        return max((r["step"] for r in rank0 if r["t"] <= at), default=0)

    gaps = [b["t"] - a["t"] for a, b in itertools.pairwise(rank0) if (b["step"], b["attempt"]) == (a["step"] + 1,
                                                                                                 a["attempt"])]
    grown = [r for r in rank0 if r["attempt"] == attempt]
    before = [r for r in rank0 if r["attempt"] < attempt]
    return Rejoin(answered_s=decided - thawed, steps_after_decision=first["step"] - last_step(decided),
                  steps_after_thaw=first["step"] - last_step(thawed), trains_s=first["t"] - decided,
                  pause_s=grown[0]["t"] - before[-1]["t"], step_s=statistics.median(gaps) if gaps else None,
                  from_memory=from_memory, accumulation_back=accumulation_back)


def wait(until: Callable[[], bool], play: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not until():
        if play.poll() is not None or time.monotonic() > deadline:
            ended = "timed out" if play.poll() is None else f"the launch ended with status {play.returncode}"
            raise SystemExit(f"bench/rejoin.py: waiting for {what}: {ended}")
        time.sleep(0.1)


def round_(inventory: Path, index: int, keep: Path | None) -> Rejoin:
    job = f"bench-rejoin-{index}-{os.getpid()}"
    play = launch(inventory, job, "-e", "vidcluster_min_nodes=2", "-e", f"ddp_config_heartbeat_timeout={HEARTBEAT_S}",
                  "-e", "ddp_config_stop_grace=10", overrides=JOB)
    watcher = Watcher([job_dir(0, job, CLUSTER).parent, job_dir(JOINER_NODE, job, CLUSTER).parent])
    try:
        wait(lambda: read(run_file(0, job, STATUS_FILE, CLUSTER)).get("epoch", 0) >= FREEZE_EPOCH, play,
             f"epoch {FREEZE_EPOCH}")
        signal_node(CLUSTER, JOINER_NODE, signal.SIGSTOP)
        wait(lambda: bool(job_record(0, job, CLUSTER).world_changes), play, "the world to shrink")
        smaller = job_record(0, job, CLUSTER).attempt
        wait(lambda: sum(r["rank"] == 0 and r["attempt"] == smaller for r in watcher.records) >= SMALLER_STEPS, play,
             f"{SMALLER_STEPS} steps of the smaller world")
        thawed = time.time()
        signal_node(CLUSTER, JOINER_NODE, signal.SIGCONT)
        if play.wait(timeout=TIMEOUT_S) != 0:
            raise SystemExit(f"bench/rejoin.py: {job}: the launch failed (status {play.returncode})")
    finally:
        signal_node(CLUSTER, JOINER_NODE, signal.SIGCONT)
        records = watcher.stop()
    if keep is not None:  # the stamped lines and the moments, to read a round again
        keep.mkdir(parents=True, exist_ok=True)
        (keep / f"{job}.json").write_text(json.dumps({"thawed": thawed, "records": records}))
    record = job_record(0, job, CLUSTER)
    grow = next(c for c in record.world_changes if c.cause == Kind.JOINED)
    joiner = record.attempts[grow.attempt].assignment[f"node{JOINER_NODE}"]
    metrics = [json.loads(line) for line in run_file(0, job, METRICS_FILE, CLUSTER).read_text().splitlines()]
    attempts = [line for line in metrics if "attempt" in line]
    log = (REPO / "runs" / job / "log.txt").read_text()  # collected by the launch
    from_memory = bool(attempts) and all(a["resumed_from"] == "memory" for a in attempts) and "resumed from" not in log
    return measure(records, thawed, grow.at, grow.attempt, joiner, from_memory=from_memory,
                   accumulation_back="accumulation 2 -> 1" in log)


def _yes(held: bool) -> str:
    return "yes" if held else "NO"


def row(index: int, r: Rejoin) -> str:
    step = "?" if r.step_s is None else f"{r.step_s:.3f}"
    return (f"| {index} | {r.answered_s:.2f} | {r.steps_after_decision} | {r.steps_after_thaw} | {r.trains_s:.2f} | "
            f"{r.pause_s:.2f} | {step} | {_yes(r.from_memory)} | {_yes(r.accumulation_back)} |")


def table(rounds: list[Rejoin]) -> str:
    lines = ["| round | answered -> decided, s | steps after the decision | steps after the thaw "
             "| decided -> trains, s | pause, s | step, s | from memory | accumulation back |", "|---" * 9 + "|"]
    return "\n".join(lines + [row(i + 1, r) for i, r in enumerate(rounds)])


def met(rounds: list[Rejoin]) -> bool:
    return all(r.steps_after_decision <= GOAL_STEPS and r.from_memory and r.accumulation_back for r in rounds)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="rounds (one job each)")
    parser.add_argument("--keep", type=Path, help="write each round's stamped sample lines in this folder")
    args = parser.parse_args()
    rounds = []
    with training_cluster(CLUSTER, 3) as inventory:
        for index in range(args.repeats):
            rounds.append(round_(inventory, index, args.keep))
            print(json.dumps(rounds[-1].__dict__), file=sys.stderr, flush=True)
    print(table(rounds))
    print(f"- node2 trains within {GOAL_STEPS} of the world's steps after the hub's decision, from memory, the "
          "accumulation back: "
          f"{'yes' if met(rounds) else 'NO'}")
    return 0 if met(rounds) else 1


if __name__ == "__main__":
    sys.exit(main())
