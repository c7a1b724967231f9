"""What a restart costs, phase by phase, against torchrun's in the same run.

    .venv/bin/python -m bench.restarts [--repeats N]   (root: a 2-node local cluster; 15 to 30 min)
    .venv/bin/python -m bench.restarts --faults [--scenario TEXT]  (root: every kind of fault, 3 nodes with a spare;
                                                                each job's goodput from its record too)
    .venv/bin/python -m bench --only restarts          (the comparison, as rows of the benchmark table)

The comparison (the default): one job, r3d_18 on 56 px clips of the synthetic dataset for EPOCHS epochs with a
mid-epoch checkpoint every CHECKPOINT_MINUTES, two training processes; once without a failure and once with one
training process SIGKILLed 2 s after the first epoch's checkpoint, under each launcher in turn:
  - torchrun --standalone --nproc-per-node 2 --max-restarts 2 (one node, local processes; its defaults);
  - launch-training.yml on two test hosts, one process each, the runtime at its shipped defaults (heartbeat timeout
    60 s, stop grace 15 s), with restart in place (the default) and without it;
  - the same with a heartbeat timeout and a stop grace of 10 s.
Every trainer writes its phases (trainer/timeline.py; under torchrun the benchmark gives it the channel folder). For
the restarted attempt, each phase is the moment every process had reached it: the failure named (the runtime's hub),
the failed attempt over on every node (its processes gone, or parked in place), the next attempt's processes
started, their imports done, their process group formed, the checkpoint chosen and loaded, the first optimizer step.
"Training again" is the kill to the first step of the next attempt, and the steps lost are those between the last
step reached and the one resumed from. The kill's cost is measured two ways:
  - within the run: the time the job stood still and went back, "training again" less the one step it includes, plus
    the steps lost, at the run's step time. The kill falls somewhere inside a step, and the part of that step done
    is lost too: half a step on average, so the figure is training again - step/2 + steps lost x step, give or take
    half a step. It compares runs made at different loads (a loaded 2-core machine: step times vary 2x between runs);
  - across runs: the job's wall time (its first process's start to rank 0's "finished") with the kill minus without,
    which on this machine varies by more than the cost itself (uninterrupted runs alone ranged 117 to 161 s).
Goals (issue 29), on the within-run cost: at the shipped defaults a kill costs at most what it costs under torchrun,
and with restart in place at most 5 s plus the steps lost.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bench.local import ENV, REPO, VENV_BIN, build, signal_node, training_cluster
from trainer.node_config import merge
from trainer.runtime.contract import CHANNEL_ENV, METRICS_FILE, STATUS_FILE
from trainer.runtime.host import channel, procs
from trainer.runtime.host.channel import PHASES, ProcessReport
from trainer.runtime.job.record import JobRecord

CLUSTER = "brestart"
EPOCHS = 6
CHECKPOINT_MINUTES = 0.1
KILL_AFTER_S = 2.0  # after the first epoch's checkpoint
IN_PLACE_GOAL_S = 5.0
JOB = {"CONFIG": {"TRAIN": {"EPOCH_NUM": EPOCHS, "CHECKPOINT_MINUTES": CHECKPOINT_MINUTES},
                  "DATA": {"CROP_SIZE": 56, "SHORT_SIDE_SIZE": 56, "NEW_HEIGHT": 64, "NEW_WIDTH": 64},
                  "MODEL": {"NAME": "r3d_18"}}}
RESUMED = re.compile(r"resumed from \S+ at epoch \d+, step (\d+)")
# The restarted attempt's phases, in order (the runtime's first two are its own: torchrun says nothing of them).
STEPS = ("named", "over", *PHASES)


@dataclass
class Run:
    """One job under one launcher: its wall time, and (with the kill) when each phase of its restart was reached."""

    launcher: str
    killed: bool
    wall_s: float
    kill_at: float | None = None
    phases: dict[str, float] = field(default_factory=dict)  # STEPS -> wall clock
    how: str = ""  # how each node's (or process's) trainer came to the restarted attempt
    lost_steps: int | None = None
    step_s: float = 0.0


# ---------------------------------------------------------------------------------------------------------------------
# torchrun


def torchrun_config(data: Path, out: Path) -> Path:
    """configs/i3d_cpu_test.yaml with the job's settings, the local dataset and its own run directory."""
    experiment = yaml.safe_load((REPO / "configs" / "i3d_cpu_test.yaml").read_text())
    local = {"CONFIG": {"DATA": dataset_paths(data), "LOG": {"BASE_PATH": str(out), "EXP_NAME": "run"}}}
    path = out / "config.yaml"
    path.write_text(yaml.safe_dump(merge(merge(experiment, JOB), local)))
    return path


def dataset_paths(data: Path) -> dict[str, str]:
    return {"TRAIN_ANNO_PATH": str(data / "train.txt"), "TRAIN_DATA_PATH": str(data),
            "VAL_ANNO_PATH": str(data / "val.txt"), "VAL_DATA_PATH": str(data)}


def reports(folder: Path) -> list[ProcessReport]:
    return [r for r in channel.processes(folder) if r.rank is not None]


def reached(found: list[ProcessReport], attempt: int, phase: str) -> float | None:
    """When every process of ``attempt`` had reached ``phase`` (None: not all of them did)."""
    times = [r.phases.get(phase) for r in found if r.attempt == attempt]
    return max(t for t in times if t is not None) if times and None not in times else None


def rank_pid(folder: Path, attempt: int, rank: int) -> int:
    return next(r.pid for r in reports(folder) if r.attempt == attempt and r.rank == rank)


def run_torchrun(data: Path, work: Path, kill: bool) -> Run:
    out = work / f"torchrun-{'kill' if kill else 'clean'}"
    out.mkdir(parents=True)
    folder = channel.make_folder(out / "channel")
    cfg = torchrun_config(data, out)
    proc = subprocess.Popen(
        [str(VENV_BIN / "torchrun"), "--standalone", "--nnodes", "1", "--nproc-per-node", "2", "--max-restarts", "2",
         "-m", "trainer.train", "--config-file", str(cfg)],
        cwd=REPO, env={**ENV, CHANNEL_ENV: str(folder), "OMP_NUM_THREADS": "1"}, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    run = out / "run"
    result = Run("torchrun", kill, 0.0)
    try:
        if kill:
            result.kill_at, old = kill_after_checkpoint(run, lambda: [rank_pid(folder, 0, 1)], proc.poll)
            old_gone = gone_at([r.pid for r in reports(folder) if r.attempt == 0])
            if proc.wait(timeout=900) != 0:
                raise SystemExit(f"torchrun ended with status {proc.returncode}")
            found = reports(folder)
            result.phases = {"over": old_gone, **{p: reached(found, 1, p) or 0.0 for p in PHASES}}
            result.how = "every process anew"
            log = (run / "log.txt").read_text()
            resumed = [int(m) for m in RESUMED.findall(log)]
            result.lost_steps = old - resumed[-1] if resumed else None
        elif proc.wait(timeout=900) != 0:
            raise SystemExit(f"torchrun ended with status {proc.returncode}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    status = read(run / STATUS_FILE)
    result.step_s = float(status.get("step_time_s") or 0.0)
    first = min(r.phases["started"] for r in reports(folder) if r.attempt == 0)
    result.wall_s = float(status["updated"]) - first
    return result


def gone_at(pids: list[int], timeout: float = 120) -> float:
    """When the last of ``pids`` ended (polled every 20 ms)."""
    deadline = time.monotonic() + timeout
    while any(Path(f"/proc/{pid}").exists() and procs._environ(pid) is not None for pid in pids):
        if time.monotonic() > deadline:
            raise SystemExit(f"processes {pids} did not end within {timeout:.0f} s")
        time.sleep(0.02)
    return time.time()


def kill_after_checkpoint(run: Path, victims: Callable[[], list[int]], ended: Callable[[], int | None]
                          ) -> tuple[float, int]:
    """SIGKILL to ``victims`` KILL_AFTER_S after the first epoch's checkpoint in ``run``; (when, rank 0's last step
    then)."""
    first = run / "checkpoints" / "epoch_0001.pth"
    while not first.exists():
        if ended() is not None:
            raise SystemExit(f"the job ended before its first epoch's checkpoint ({run})")
        time.sleep(0.05)
    time.sleep(KILL_AFTER_S)
    pids = victims()
    at = time.time()
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    return at, int(read(run / STATUS_FILE).get("step") or 0)


def read(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


# ---------------------------------------------------------------------------------------------------------------------
# the runtime on a local cluster


def home(node: int, cluster: str = CLUSTER) -> Path:
    return REPO / ".local-cluster" / cluster / "nodes" / str(node) / "home"


def job_dir(node: int, job: str, cluster: str = CLUSTER) -> Path:
    """The node's folder of the job, as this machine sees it."""
    return home(node, cluster) / "vidcluster" / "jobs" / job / f"node{node}"


def run_file(node: int, job: str, name: str, cluster: str = CLUSTER) -> Path:
    return home(node, cluster) / "vidcluster" / "jobs" / job / "run" / name


def launch(inventory: Path, job: str, *extra: str, overrides: dict[str, Any] = JOB) -> subprocess.Popen[bytes]:
    """launch-training.yml of configs/i3d_cpu_test.yaml with ``overrides`` as job ``job``, in the background."""
    return subprocess.Popen(
        [str(VENV_BIN / "ansible-playbook"), "-i", str(inventory), "launch-training.yml", "-e", "config=i3d_cpu_test",
         "-e", f"job_id={job}", "-e", "ddp_config_omp_num_threads=1", "-e", "ddp_launch_poll_seconds=2",
         "-e", json.dumps({"ddp_config_overrides": overrides}), *extra],
        cwd=REPO, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip


def job_record(node: int, job: str, cluster: str = CLUSTER) -> JobRecord:
    return JobRecord.read(read(job_dir(node, job, cluster) / "state.json")["record"])


def record_phases(record: JobRecord, attempt: int) -> dict[str, float]:
    """When every node of ``attempt`` had reached each phase (STEPS), from the job's record."""
    entry = record.attempts[attempt]
    assert entry.cause is not None
    found = {"named": entry.cause.detected_at, "over": entry.stopped_at or entry.started_at}
    for phase in PHASES:
        times = [getattr(t, phase) for t in entry.nodes.values()]
        found[phase] = max(t for t in times if t is not None) if times and None not in times else 0.0
    return found


def run_runtime(inventory: Path, name: str, job: str, kill: bool, *extra: str) -> Run:
    play = launch(inventory, job, *extra)
    result = Run(name, kill, 0.0)
    if kill:
        victim = lambda: [int(read(job_dir(1, job) / "state.json")["trainer"]["pid"])]  # noqa: E731
        result.kill_at, _ = kill_after_checkpoint(run_file(0, job, ""), victim, play.poll)
    if play.wait(timeout=1200) != 0:
        raise SystemExit(f"{job}: the launch failed (status {play.returncode})")
    record = job_record(0, job)
    status = read(run_file(0, job, STATUS_FILE))
    result.step_s = float(status.get("step_time_s") or 0.0)
    result.wall_s = float(status["updated"]) - min(t.started for t in record.attempts[0].nodes.values())
    if kill:
        if record.restarts != 1:
            raise SystemExit(f"{job}: {record.restarts} restarts, not 1")
        result.phases = record_phases(record, 1)
        result.how = ", ".join(f"{node} {t.start}" for node, t in sorted(record.attempts[1].nodes.items()))
        restarted = next(r for r in map(json.loads, run_file(0, job, METRICS_FILE).read_text().splitlines())
                         if r.get("attempt") == 1)
        result.lost_steps = restarted["steps_lost"]
    return result


RUNTIMES: dict[str, tuple[str, ...]] = {
    "runtime, shipped defaults, restart in place": (),
    "runtime, shipped defaults, no restart in place": ("-e", "ddp_config_restart_in_place=false"),
    "runtime, heartbeat 10 s, stop grace 10 s, restart in place": (
        "-e", "ddp_config_heartbeat_timeout=10", "-e", "ddp_config_stop_grace=10"),
}


@contextmanager
def dataset(*options: str) -> Iterator[Path]:
    """The synthetic dataset (``python -m trainer make-dataset``), two classes unless ``options`` say otherwise."""
    with tempfile.TemporaryDirectory(prefix="bench-restarts-") as tmp:
        data = Path(tmp) / "vidcluster-test"
        subprocess.run([str(VENV_BIN / "python"), "-m", "trainer", "make-dataset", str(data),
                        *(options or ("--classes", "left", "right"))], cwd=REPO, check=True, capture_output=True)
        yield data


def compare(repeats: int = 1) -> list[Run]:
    """Every launcher without and with the kill, interleaved (``repeats`` rounds); the runs in order."""
    runs: list[Run] = []
    with training_cluster(CLUSTER, 2) as inventory, dataset() as data, tempfile.TemporaryDirectory() as work:
        for round_ in range(repeats):
            for kill in (False, True):
                runs.append(run_torchrun(data, Path(work) / str(round_), kill))
                say(runs[-1])
                for index, (name, extra) in enumerate(RUNTIMES.items()):
                    job = f"bench-{round_}-{index}-{'kill' if kill else 'clean'}-{os.getpid()}"
                    runs.append(run_runtime(inventory, name, job, kill, *extra))
                    say(runs[-1])
            shutil.rmtree(Path(work) / str(round_), ignore_errors=True)
    return runs


def say(run: Run) -> None:
    print(json.dumps(run.__dict__), file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------------------------------
# the table


@dataclass
class Row:
    """One launcher: the walls (best over the rounds), the kill's cost, and its restart's phases (median)."""

    launcher: str
    clean_s: float
    killed_s: float
    phases: dict[str, float | None]  # STEPS -> seconds after the step before (None: not said by this launcher)
    again_s: float  # the kill to the first step of the restarted attempt
    lost_steps: int | None
    lost_s: float | None
    how: str
    step_s: float  # the killed run's step time

    @property
    def cost_s(self) -> float:
        """The kill's cost across runs: wall time with it minus without."""
        return self.killed_s - self.clean_s

    @property
    def stall_s(self) -> float:
        """The kill's cost within the run (see the module docstring), give or take half a step."""
        return self.again_s - self.step_s / 2 + (self.lost_s or 0.0)


def median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def rows(runs: list[Run]) -> list[Row]:
    found = []
    for launcher in dict.fromkeys(run.launcher for run in runs):
        clean = [r for r in runs if r.launcher == launcher and not r.killed]
        killed = [r for r in runs if r.launcher == launcher and r.killed]
        phases: dict[str, float | None] = {}
        before = [r.kill_at or 0.0 for r in killed]
        for step in STEPS:
            if step not in killed[0].phases:
                phases[step] = None
                continue
            at = [r.phases[step] for r in killed]
            phases[step] = median([a - b for a, b in zip(at, before, strict=True)])
            before = at
        again = median([r.phases["first_step"] - (r.kill_at or 0.0) for r in killed])
        lost = killed[0].lost_steps
        step_s = median([r.step_s for r in killed])
        found.append(Row(launcher, min(r.wall_s for r in clean), min(r.wall_s for r in killed), phases, again, lost,
                         None if lost is None else round(lost * step_s, 1), killed[0].how, step_s))
    return found


def goals(found: list[Row]) -> dict[str, bool]:
    """(issue 29, on the kill's cost within the run) at the shipped defaults at most torchrun's; with restart in
    place at most IN_PLACE_GOAL_S plus the steps lost."""
    base = next(r for r in found if r.launcher == "torchrun")
    defaults = [r for r in found if "shipped defaults" in r.launcher]
    in_place = [r for r in found if r.launcher.endswith(", restart in place")]
    return {**{f"{r.launcher}: the kill costs at most torchrun's": r.stall_s <= base.stall_s for r in defaults},
            **{f"{r.launcher}: the kill costs at most {IN_PLACE_GOAL_S:.0f} s plus the steps lost":
               r.stall_s - (r.lost_s or 0.0) <= IN_PLACE_GOAL_S for r in in_place}}


def table(found: list[Row]) -> str:
    base = next(r for r in found if r.launcher == "torchrun")
    heads = ("named", "over on every node", "started", "imported", "group formed", "checkpoint loaded", "first step")
    lines = ["| launcher | the kill's cost within the run, s (vs torchrun) | wall, no failure, s | "
             "wall, one SIGKILL, s | the kill's cost across runs, s | " + " | ".join(f"{h}, s" for h in heads)
             + " | training again after the kill, s (vs torchrun) | step, s | steps lost (s) | how the trainers came "
             "back |",
             "|---" * (10 + len(heads)) + "|"]
    for row in found:
        cells = ["" if row.phases[s] is None else f"{row.phases[s]:.1f}" for s in STEPS]
        if row is base:
            cells[1] = f"{row.phases['over']:.1f} (named and over)"
        lines.append(
            f"| {row.launcher} | {row.stall_s:.1f} ± {row.step_s / 2:.1f} ({row.stall_s / base.stall_s:.2f}x) | "
            f"{row.clean_s:.1f} | {row.killed_s:.1f} | {row.cost_s:.1f} | {' | '.join(cells)} | {row.again_s:.1f} "
            f"({row.again_s / base.again_s:.2f}x) | {row.step_s:.1f} | {row.lost_steps} ({row.lost_s}) | {row.how} |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------------------
# every kind of fault (--faults): a 3-node cluster, 2 trainers and a spare, heartbeat timeout and stop grace 10 s


FAULT_CLUSTER = "brfaults"
HEARTBEAT_S = 10.0


def fault_trainer(job: str, node: int) -> int:
    """The node's trainer of the job (its supervisor's state says which process it is)."""
    return int(read(job_dir(node, job, FAULT_CLUSTER) / "state.json")["trainer"]["pid"])


def kill_node(node: int) -> None:
    signal_node(FAULT_CLUSTER, node, signal.SIGKILL)


def preempt(job: str) -> None:
    for node in (0, 1):
        os.kill(read(job_dir(node, job, FAULT_CLUSTER) / "state.json")["pid"], signal.SIGTERM)


def two_kills(job: str) -> None:
    """node1's trainer killed, then, once the next attempt trains on every node and 4 s more, node0's."""
    os.kill(fault_trainer(job, 1), signal.SIGKILL)
    deadline = time.monotonic() + 300
    while True:
        record = job_record(0, job, FAULT_CLUSTER)
        if record.attempt >= 1 and all(t.first_step for t in record.attempts[1].nodes.values()):
            break
        if time.monotonic() > deadline:
            raise SystemExit(f"{job}: the attempt after the first kill did not train within 300 s")
        time.sleep(0.2)
    time.sleep(4)
    os.kill(fault_trainer(job, 0), signal.SIGKILL)


SCENARIOS: dict[str, tuple[Callable[[str], None], int]] = {  # the fault, and the node whose hub records it
    "a trainer killed (SIGKILL)": (lambda job: os.kill(fault_trainer(job, 1), signal.SIGKILL), 0),
    "a trainer frozen (SIGSTOP)": (lambda job: os.kill(fault_trainer(job, 0), signal.SIGSTOP), 0),
    "a node lost (every process)": (lambda job: kill_node(1), 0),
    "the rank-0 node lost (with the job's hub)": (lambda job: kill_node(0), 1),
    "SIGTERM to every supervisor (preemption)": (preempt, 0),
    "two trainers killed, one after the other": (two_kills, 0),
}
GOODPUT_PARTS = ("trained", "startup", "detection", "restart", "recomputed", "checkpoint", "data", "other")


def measure_fault(inventory: Path, name: str, index: int) -> dict[str, Any]:
    fault, hub = SCENARIOS[name]
    job = f"bench-fault-{index}-{os.getpid()}"
    overrides = {"CONFIG": {"TRAIN": {"EPOCH_NUM": 40, "CHECKPOINT_MINUTES": CHECKPOINT_MINUTES}}}
    play = launch(inventory, job, "-e", "ddp_config_stop_grace=10", "-e", f"ddp_config_heartbeat_timeout={HEARTBEAT_S}",
                  "-e", "ddp_launch_recheck_seconds=15", overrides=overrides)
    while read(run_file(0, job, STATUS_FILE, FAULT_CLUSTER)).get("epoch", 0) < 6:
        if play.poll() is not None:
            raise SystemExit(f"{job}: the launch ended (status {play.returncode}) before epoch 6")
        time.sleep(0.2)
    time.sleep(4)  # into the epoch, past its last mid-epoch checkpoint: some training to lose
    fault(job)
    play.wait(timeout=900)
    record = job_record(hub, job, FAULT_CLUSTER)
    cause = record.attempts[1].cause
    assert cause is not None
    rank0 = 1 if hub == 1 else 0
    restarted = next(r for r in map(json.loads, run_file(rank0, job, METRICS_FILE, FAULT_CLUSTER).read_text()
                                    .splitlines()) if r.get("attempt") == 1)
    status = read(run_file(rank0, job, STATUS_FILE, FAULT_CLUSTER))
    lost = restarted["steps_lost"]
    again = record_phases(record, 1)["first_step"] - cause.detected_at
    return {"scenario": name, "cause": f"{cause.node} {cause.kind}", "detect_s": cause.detect_s,
            "again_s": round(again, 1), "lost_steps": lost,
            "lost_s": None if lost is None else round(lost * (status.get("step_time_s") or 0.0), 1),
            "how": ", ".join(f"{node} {t.start}" for node, t in sorted(record.attempts[1].nodes.items())),
            "finished": status.get("state") == "finished", "restarts": record.restarts,
            "goodput": None if record.goodput is None else dataclasses.asdict(record.goodput)}


def faults(only: str = "") -> list[dict[str, Any]]:
    """Every scenario whose name holds ``only``."""
    results = []
    with training_cluster(FAULT_CLUSTER, 3, "-e", "spares=1") as inventory:
        for index, name in enumerate(SCENARIOS):
            if only not in name:
                continue
            build(FAULT_CLUSTER, 3, "-e", "spares=1")  # a node a scenario killed comes back for the next one
            results.append(measure_fault(inventory, name, index))
            print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    return results


def goodput_table(found: list[dict[str, Any]]) -> str:
    """Each job's goodput from its record (trainer/runtime/job/goodput.py): its wall time and the parts adding up to
    it."""
    lines = ["| failure | restarts | wall, s | " + " | ".join(f"{part}, s" for part in GOODPUT_PARTS)
             + " | the parts' sum, s | goodput |", "|---" * (5 + len(GOODPUT_PARTS)) + "|"]
    for row in found:
        spent = row["goodput"]
        if spent is None:
            lines.append(f"| {row['scenario']} | {row['restarts']} | no goodput on record |")
            continue
        parts = [spent[f"{part}_s"] for part in GOODPUT_PARTS]
        lines.append(f"| {row['scenario']} | {row['restarts']} | {spent['wall_s']:.1f} | "
                     + " | ".join(f"{part:.1f}" for part in parts)
                     + f" | {sum(parts):.1f} | {spent['trained_s'] / spent['wall_s']:.0%} |")
    return "\n".join(lines)


def fault_goals(row: dict[str, Any]) -> tuple[bool, bool, bool]:
    """(detected within the heartbeat timeout + 5 s, training again within 60 s, at most CHECKPOINT_MINUTES lost)."""
    lost = row["lost_s"]
    return (row["detect_s"] <= HEARTBEAT_S + 5, row["again_s"] <= 60,
            lost is not None and lost <= CHECKPOINT_MINUTES * 60)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1, help="rounds of every run (the table takes the median)")
    parser.add_argument("--faults", action="store_true", help="every kind of fault instead of the comparison")
    parser.add_argument("--scenario", default="", help="with --faults: only the scenarios whose name holds this")
    args = parser.parse_args()
    if args.faults:
        found = faults(args.scenario)
        print("| failure | cause on record | detected, s | training again after, s | lost, steps (s) | how the "
              "trainers came back | finished |")
        print("|---|---|---|---|---|---|---|")
        for row in found:
            print(f"| {row['scenario']} | {row['cause']} | {row['detect_s']} | {row['again_s']} | {row['lost_steps']} "
                  f"({row['lost_s']}) | {row['how']} | {'yes' if row['finished'] else 'no'} |")
        print(goodput_table(found))
        return 0 if all(all(fault_goals(row)) and row["finished"] for row in found) else 1
    start, load = time.perf_counter(), os.getloadavg()[0]
    found = rows(compare(args.repeats))
    print(table(found))
    met = goals(found)
    for goal, held in met.items():
        print(f"- {goal}: {'yes' if held else 'NO'}")
    print(f"\n{os.cpu_count()} CPU cores, load average {load:.1f} before, {os.getloadavg()[0]:.1f} after, "
          f"{time.perf_counter() - start:.0f} s")
    return 0 if all(met.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
