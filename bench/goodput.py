"""Goodput at length: one long job with no spare and faults on a timetable, under our runtime and under torchrun's
elastic agent in turn, in the same run (issue 37).

    .venv/bin/python -m bench.goodput [--minutes 40] [--launchers ours torchrun]
                                      (root; per launcher the job's minutes plus about 5 for the cluster)

The job: r3d_18 on 56 px clips (bench/restarts.py's) on a larger synthetic dataset (TRAIN_PER_CLASS videos per
class, so an epoch's end and its evaluation are a small part of it), three nodes of one training process each, a
mid-epoch checkpoint every CHECKPOINT_MINUTES, MAX_RESTARTS restarts allowed, RESUME auto (configs/i3d_cpu_test.yaml
otherwise: its collective timeout is DDP_CONFIG.TIMEOUT_SECONDS 120).
  - ours: launch-training.yml on a 3-node local cluster, vidcluster_min_nodes 2, the heartbeat timeout and stop grace
    HEARTBEAT_S (as bench/restarts.py --faults);
  - torchrun: three agents on loopback, ``torchrun --nnodes=2:3 --nproc-per-node=1 --max-restarts=MAX_RESTARTS
    --rdzv-backend=c10d`` (its defaults otherwise: a rendezvous waits its last call, 30 s, for more nodes), each
    running ``python -m trainer.train``; a restart starts every worker anew from the last checkpoint.
The faults, at fractions of the job's length from its first step (at 40 minutes: a trainer killed every 10 minutes,
node2 lost at 15):
  - at 1/4, 1/2 and 3/4: a trainer SIGKILLed (node1's, node2's, node1's);
  - at 3/8: node2's machine hangs (every process of its namespace, or its agent and worker, stopped) until the world
    has shrunk to node0 and node1, then THAWED_AFTER_S more; then it answers again and rejoins the running job.
At the end the bench stops the job as a person would (ours: stop-training.yml; torchrun: SIGTERM to its agents; the
trainers save a checkpoint at a common step either way) and prints each job's goodput, part by part
(trainer/runtime/job/goodput.py: start-up included). Ours from its own record; torchrun keeps none, so its record
is rebuilt from its workers' heartbeats (the trainer's step clock, VIDCLUSTER_HEARTBEAT_DIR): one attempt per
rendezvous round that trained, its failure at the last step seen before it (torchrun names none: its detection is
inside its restart).
Goal: ours at least GOAL of the wall time trained.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from bench.local import ENV, REPO, VENV_BIN, playbook, signal_node, training_cluster
from bench.restarts import GOODPUT_PARTS, JOB, dataset_paths, job_dir, job_record, read, run_file
from trainer.node_config import merge
from trainer.runtime.contract import HEARTBEAT_DIR_ENV, HEARTBEAT_INTERVAL_ENV, JOB_DIR_ENV, STATUS_FILE
from trainer.runtime.host import procs
from trainer.runtime.host.ports import free_port
from trainer.runtime.job import goodput
from trainer.runtime.job.pace import Effort, read_beat, slowest
from trainer.runtime.job.record import (
    LAUNCH_VERSION,
    SCHEMA,
    Attempt,
    Cause,
    JobRecord,
    Kind,
    Phase,
    Spent,
)

CLUSTER = "bgood"
NODES = 3
HEARTBEAT_S = 10.0
CHECKPOINT_MINUTES = 2.0
TRAIN_PER_CLASS = 200
DATA = "data/goodput"
THAWED_AFTER_S = 30.0
MAX_RESTARTS = 8  # the timetable's 4 failures (a grow is no failure); the shipped 3 would end the job at the last kill
GOAL = 0.95
SHRINK_WAIT_S = 600  # for the world to shrink once node2 hangs (torchrun: the collective timeout, then its rendezvous)
POLL_S = 1.0
ROUND_S = 60.0  # a rendezvous round's workers have their first batch within this of each other
LAUNCHERS = ("ours", "torchrun")


@dataclass(frozen=True)
class Result:
    """One launcher's job: its record (torchrun's rebuilt) and its worlds, attempt by attempt."""

    launcher: str
    record: JobRecord
    worlds: str


def job_overrides(data: str) -> dict[str, object]:
    """bench/restarts.py's job (r3d_18 on 56 px clips: its steps compute-bound, as a real job's are, where i3d_tiny's
    wait for decoding on this machine's shared cores) on the larger dataset at ``data``, for as long as the bench
    lets it run."""
    return merge(JOB, {"CONFIG": {"TRAIN": {"EPOCH_NUM": 100000, "CHECKPOINT_MINUTES": CHECKPOINT_MINUTES},
                                  "VAL": {"FREQ": 10},
                                  "DATA": {"TRAIN_ANNO_PATH": f"{data}/train.txt", "TRAIN_DATA_PATH": data,
                                           "VAL_ANNO_PATH": f"{data}/val.txt", "VAL_DATA_PATH": data}}})


@contextlib.contextmanager
def made_dataset() -> Iterator[Path]:
    """The larger dataset, made here."""
    with tempfile.TemporaryDirectory(prefix="bench-goodput-") as tmp:
        data = Path(tmp) / "goodput"
        subprocess.run([str(VENV_BIN / "python"), "-m", "trainer", "make-dataset", str(data), "--classes", "left",
                        "right", "--train-per-class", str(TRAIN_PER_CLASS), "--val-per-class", "6"],
                       cwd=REPO, check=True, capture_output=True)  # fmt: skip
        yield data


def say(line: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} goodput bench: {line}", file=sys.stderr, flush=True)


def timetable(kill: Callable[[int], None], hang: Callable[[int], None],
              minutes: float) -> list[tuple[float, Callable[[], None]]]:
    """(seconds after the first step, the fault)."""
    length = minutes * 60
    return [(length / 4, lambda: kill(1)), (3 * length / 8, lambda: hang(2)),
            (length / 2, lambda: kill(2)), (3 * length / 4, lambda: kill(1))]


def run_timetable(faults: list[tuple[float, Callable[[], None]]], minutes: float) -> None:
    started = time.monotonic()
    for at, fault in faults:
        time.sleep(max(0.0, started + at - time.monotonic()))
        fault()
    time.sleep(max(0.0, started + minutes * 60 - time.monotonic()))


def hang(node: int, freeze: Callable[[signal.Signals], None], shrunk: Callable[[], bool]) -> None:
    """The node's processes stopped (``freeze``) until the world has shrunk (``shrunk``), then THAWED_AFTER_S more."""
    freeze(signal.SIGSTOP)
    say(f"node{node} hangs")
    try:
        deadline = time.monotonic() + SHRINK_WAIT_S
        while not shrunk():
            if time.monotonic() > deadline:
                raise SystemExit(f"the world did not shrink within {SHRINK_WAIT_S} s of node{node} hanging")
            time.sleep(0.5)
        say("the world shrank")
        time.sleep(THAWED_AFTER_S)
    finally:
        freeze(signal.SIGCONT)
    say(f"node{node} answers again")


# ---------------------------------------------------------------------------------------------------------------------
# ours


def run_ours(minutes: float) -> Result:
    with training_cluster(CLUSTER, NODES) as inventory:
        with made_dataset() as data:
            playbook("-i", str(inventory), "playbooks/stage-data.yml", "-e", f"src={data}", "-e", f"dest={DATA}")
        found = run_job(inventory, minutes)
    worlds = "; ".join(f"{c.cause} {'+'.join(c.left or c.joined)} {c.before}->{c.after}" for c in found.world_changes)
    return Result("ours", found, worlds)


def run_job(inventory: Path, minutes: float) -> JobRecord:
    job = f"bench-goodput-{os.getpid()}"

    def record() -> JobRecord:
        return job_record(0, job, CLUSTER)

    def kill(node: int) -> None:
        os.kill(int(read(job_dir(node, job, CLUSTER) / "state.json")["trainer"]["pid"]), signal.SIGKILL)
        say(f"node{node}'s trainer killed")

    def hang_node(node: int) -> None:
        changes = len(record().world_changes)
        hang(node, lambda sig: signal_node(CLUSTER, node, sig), lambda: len(record().world_changes) > changes)

    play = subprocess.Popen(
        [str(VENV_BIN / "ansible-playbook"), "-i", str(inventory), "launch-training.yml", "-e", "config=i3d_cpu_test",
         "-e", f"job_id={job}", "-e", "vidcluster_min_nodes=2", "-e", f"max_restarts={MAX_RESTARTS}",
         "-e", "ddp_config_omp_num_threads=1",
         "-e", f"ddp_config_heartbeat_timeout={HEARTBEAT_S}", "-e", f"ddp_config_stop_grace={HEARTBEAT_S}",
         "-e", "ddp_launch_poll_seconds=5", "-e", json.dumps({"ddp_config_overrides": job_overrides("~/" + DATA)})],
        cwd=REPO, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        while read(run_file(0, job, STATUS_FILE, CLUSTER)).get("state") != "running":
            if play.poll() is not None:
                raise SystemExit(f"{job}: the launch ended (status {play.returncode}) before the job trained")
            time.sleep(1)
        say(f"ours: {job} trains")
        run_timetable(timetable(kill, hang_node, minutes), minutes)
        # as a person would: every node's trainer checkpoints at a common step and exits
        playbook("-i", str(inventory), "stop-training.yml", "-e", f"job_id={job}")
        say("ours: stopped")
        play.wait(timeout=600)
    finally:
        if play.poll() is None:
            play.kill()
        signal_node(CLUSTER, 2, signal.SIGCONT)
    return record()


# ---------------------------------------------------------------------------------------------------------------------
# torchrun


@dataclass
class Worker:
    """One torchrun worker process: its agent (node), its world, and what its step clock counted (its heartbeat)."""

    pid: int
    node: int
    world: int
    effort: Effort | None = None
    stepped_at: float = 0.0  # wall clock: when the bench saw its step count grow last


def environment(pid: int) -> dict[str, str] | None:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


def node_dirs(out: Path) -> list[str]:
    """Each node's mark: its agent and everything that agent starts carry ``VIDCLUSTER_JOB_DIR=<its dir>``, so that
    trainer.runtime.host.procs finds them as it finds a job's processes (a worker is in a session of its own)."""
    return [str(out / f"node{node}") for node in range(NODES)]


class Workers:
    """Every worker of the job so far, read every POLL_S from the heartbeat folder and /proc."""

    def __init__(self, beats: Path, dirs: list[str]) -> None:
        self.beats, self.dirs = beats, dirs
        self.known: dict[int, Worker | None] = {}  # None: gone before its environment was read
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.done.wait(POLL_S):
            self.poll()

    def poll(self) -> None:
        now = time.time()
        with self.lock:
            for path in self.beats.iterdir():
                if path.name.isdigit():
                    self._heard(int(path.name), path, now)

    def _heard(self, pid: int, path: Path, now: float) -> None:
        if pid not in self.known:  # a heartbeat's pid is a training process's
            env = environment(pid)
            mark = env.get(JOB_DIR_ENV) if env is not None else None
            self.known[pid] = (None if env is None or mark not in self.dirs
                               else Worker(pid, self.dirs.index(mark), int(env["WORLD_SIZE"])))
        worker, beat = self.known[pid], read_beat(path)
        if worker is None or beat is None or beat.effort is None:
            return
        if worker.effort is None or beat.effort.steps > worker.effort.steps:
            worker.stepped_at = now
        worker.effort = beat.effort

    def trained(self) -> list[Worker]:
        with self.lock:
            return [w for w in self.known.values() if w is not None and w.effort is not None]

    def stop(self) -> list[Worker]:
        self.done.set()
        self.thread.join()
        self.poll()
        return self.trained()


def rounds(workers: list[Worker]) -> list[list[Worker]]:
    """The workers grouped by rendezvous round, in order: a round's workers reach their first batch together (within
    ROUND_S of each other)."""

    def first(worker: Worker) -> float:
        return worker.effort.training_from if worker.effort is not None else 0.0

    found: list[list[Worker]] = []
    for worker in sorted(workers, key=first):
        last = found[-1] if found else []
        same = bool(last) and last[0].world == worker.world and first(worker) - first(last[0]) < ROUND_S
        if same and len(last) < worker.world:
            last.append(worker)
        else:
            found.append([worker])
    return found


def torchrun_record(launched: float, ended: float, trained: list[list[Worker]]) -> JobRecord:
    """The job's record as ours would keep it: an attempt per round, its cause at the round before's last step."""
    attempts, spent = [], []
    for index, members in enumerate(trained):
        cause = None
        if index:
            before = trained[index - 1]
            at = max(w.stepped_at for w in before)
            grew, shrank = members[0].world > before[0].world, members[0].world < before[0].world
            kind = Kind.JOINED if grew else Kind.LOST if shrank else Kind.KILLED
            cause = Cause("torchrun", kind, f"{before[0].world} -> {members[0].world} nodes", at, detected_at=at)
        attempts.append(Attempt(attempt=index, started_at=launched if cause is None else cause.at, assignment={},
                                rendezvous="", cause=cause, stopped_at=None, nodes={}))
        effort = slowest(w.effort for w in members if w.effort is not None)
        if effort is not None:
            spent.append(Spent(index, effort))
    restarts = sum(1 for a in attempts if a.cause is not None and a.cause.kind is not Kind.JOINED)
    record = JobRecord(
        schema=SCHEMA, version=LAUNCH_VERSION, job="torchrun", term=0, hub="", attempt=len(attempts) - 1,
        phase=Phase.ENDED, assignment={}, rendezvous="", world_urls=(), directory={}, restarts=restarts,
        max_restarts=MAX_RESTARTS, lost={}, attempts=tuple(attempts), first_failure=None, detected_at=None,
        failed_step=None, waiting="", end=None, stragglers={}, spent=tuple(spent), goodput=None)
    return replace(record, goodput=goodput.account(record, None, ended))


def run_torchrun(minutes: float) -> Result:
    out = Path(tempfile.mkdtemp(prefix="bench-goodput-"))  # kept: the agents' logs and the run folder
    say(f"torchrun's logs and run folder: {out}")
    with made_dataset() as data:
        experiment = yaml.safe_load((REPO / "configs" / "i3d_cpu_test.yaml").read_text())
        local = {"CONFIG": {"DATA": dataset_paths(data), "LOG": {"BASE_PATH": str(out), "EXP_NAME": "torchrun"}}}
        cfg = out / "torchrun.yaml"
        cfg.write_text(yaml.safe_dump(merge(merge(experiment, job_overrides(str(data))), local)))
        beats = out / "heartbeats"
        beats.mkdir()
        env = {**ENV, "OMP_NUM_THREADS": "1", HEARTBEAT_DIR_ENV: str(beats), HEARTBEAT_INTERVAL_ENV: str(POLL_S)}
        dirs, port, launched = node_dirs(out), free_port(), time.time()
        agents: list[subprocess.Popen[bytes]] = []
        try:
            for node in range(NODES):
                agents.append(subprocess.Popen(
                    [str(VENV_BIN / "torchrun"), "--nnodes=2:3", "--nproc-per-node=1",
                     f"--max-restarts={MAX_RESTARTS}", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
                     f"--rdzv-id=bench-goodput-{os.getpid()}", "-m", "trainer.train", "--config-file", str(cfg)],
                    cwd=REPO, env={**env, JOB_DIR_ENV: dirs[node]}, stdout=subprocess.DEVNULL,
                    stderr=(out / f"torchrun-node{node}.txt").open("w"), start_new_session=True))  # fmt: skip
                time.sleep(2.0 if node == 0 else 0.0)  # node 0's agent hosts the rendezvous store
            workers = Workers(beats, dirs)
            ended = drive_torchrun(agents, workers, minutes)
        finally:
            for node, agent in enumerate(agents):  # and everything it started
                procs.signal_all(procs.job_processes(dirs[node]), signal.SIGKILL)
                agent.wait()
    trained = rounds(workers.stop())
    worlds = " -> ".join(str(members[0].world) for members in trained)
    return Result("torchrun", torchrun_record(launched, ended, trained), f"nodes per round: {worlds}")


def drive_torchrun(agents: list[subprocess.Popen[bytes]], workers: Workers, minutes: float) -> float:
    """The timetable's faults to torchrun's workers, then the stop; returns when the agents had ended."""

    def kill(node: int) -> None:
        pids = [w.pid for w in workers.trained() if w.node == node and procs.belongs(w.pid, workers.dirs[node])]
        procs.signal_all(pids, signal.SIGKILL)
        say(f"node{node}'s trainer killed" if pids else f"node{node}: no trainer to kill")

    def hang_node(node: int) -> None:
        pids = procs.job_processes(workers.dirs[node])  # its machine: the agent and all it started
        hang(node, lambda sig: procs.signal_all(pids, sig), lambda: any(w.world < NODES for w in workers.trained()))

    deadline = time.monotonic() + 600
    while not workers.trained():
        if time.monotonic() > deadline or any(a.poll() is not None for a in agents):
            raise SystemExit(f"torchrun: no worker trained ({[a.poll() for a in agents]})")
        time.sleep(POLL_S)
    say("torchrun: the job trains")
    run_timetable(timetable(kill, hang_node, minutes), minutes)
    for agent in agents:  # as a person would (Ctrl-C, scancel): its workers checkpoint at a common step and exit
        with contextlib.suppress(ProcessLookupError):
            os.kill(agent.pid, signal.SIGTERM)
    for agent in agents:
        agent.wait(timeout=600)
    say("torchrun: stopped")
    return time.time()


# ---------------------------------------------------------------------------------------------------------------------


def report(results: list[Result]) -> str:
    lines = ["| launcher | restarts | world changes | wall, s | " + " | ".join(f"{p}, s" for p in GOODPUT_PARTS)
             + " | goodput |", "|---" * (5 + len(GOODPUT_PARTS)) + "|"]
    for result in results:
        spent = result.record.goodput
        if spent is None:
            lines.append(f"| {result.launcher} | no goodput on record |")
            continue
        parts = " | ".join(f"{getattr(spent, f'{part}_s'):.1f}" for part in GOODPUT_PARTS)
        lines.append(f"| {result.launcher} | {result.record.restarts} | {result.worlds} | {spent.wall_s:.0f} | "
                     f"{parts} | {spent.trained_s / spent.wall_s:.1%} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=40.0, help="the job's length, from its first step")
    parser.add_argument("--launchers", nargs="+", choices=LAUNCHERS, default=list(LAUNCHERS))
    args = parser.parse_args()
    start, load = time.perf_counter(), os.getloadavg()[0]
    results = []
    for launcher in args.launchers:
        results.append(run_ours(args.minutes) if launcher == "ours" else run_torchrun(args.minutes))
        print(report(results[-1:]), file=sys.stderr, flush=True)
    print(report(results))
    print(f"\n{os.cpu_count()} CPU cores, load average {load:.1f} before, {os.getloadavg()[0]:.1f} after, "
          f"{time.perf_counter() - start:.0f} s")
    ours = next((r.record.goodput for r in results if r.launcher == "ours"), None)
    return 0 if ours is None or ours.trained_s >= GOAL * ours.wall_s else 1


if __name__ == "__main__":
    sys.exit(main())
