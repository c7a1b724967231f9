"""A node lost with no spare, under three elastic launchers side by side in one run (issue 37).

    .venv/bin/python -m bench.elastic             (about 2 minutes on a 2-core CPU; no root)
    .venv/bin/python -m bench --only elastic      (the same, as rows of the benchmark table)
    .venv/bin/python -m bench.elastic --recipe    (the recipe kept with BatchNorm, over 6 seeds: below)

One job in every arm: i3d_tiny (configs/i3d_cpu_test.yaml) on the synthetic dataset, EPOCHS epochs of BATCH clips per
process and step, two "nodes" of one process each on loopback (gloo); the fault: node 1 SIGKILLed (its launcher and its
training process) once the job has trained KILL_STEP optimizer steps (mid-epoch 2), and no spare to take its place.
  - torchrun: two agents, ``torchrun --nnodes=1:2 --max-restarts=3 --rdzv-backend=c10d`` (its defaults otherwise),
    each running ``python -m trainer.train`` with a mid-epoch checkpoint every CHECKPOINT_MINUTES and RESUME auto; the
    survivor's agent re-forms the world with itself alone and starts its worker anew, which resumes from the last
    checkpoint (the trainer keeps the global batch by accumulation: torchrun alone would have halved it);
  - torchft 0.2.0 (requirements-dev.txt): its lighthouse (a quorum of 1 allowed, stragglers waited for 1 s, a 100 ms
    tick; its heartbeat timeout at its default, 5 s) and two replica groups (this module's ``--torchft-replica``: a
    plain loop over the trainer's model, dataset, loader, optimizer and schedule under torchft's Manager on its
    ProcessGroupGloo, each gradient averaged by Manager.allreduce as torchft's PureDistributedDataParallel does: its
    DistributedDataParallel fails an assertion in its comm hook when a peer dies); the survivor goes on alone,
    averaging over the healthy replicas (the global batch halves), the lost replica's share of the epoch not trained;
  - ours: ``python -m trainer.train`` with restart in place, driven as tests/trainer/test_elastic_runs.py drives it:
    the bench plays the supervisors' part at once (the attempt over through each survivor's channel, then the next
    attempt with one address fewer), so the runtime's detection is not included (it is measured in
    bench/restarts.py --faults) and is reported as 0 (driven); the survivor goes on from memory, the global batch kept.
With ``--recipe`` (about 7 minutes), the recipe with BatchNorm instead: for each of 6 seeds, ours on 3 nodes
uninterrupted and with node 2 lost mid-epoch 6 (the survivors go on on 2 from memory, accumulating over the missing
share); BatchNorm's statistics are per rank, so the weights differ: the goal is the mean final top-1 within 2 points.
Each arm's timing comes from the training processes' own sample logs (one line per optimizer step; the trainer's
LOG.SAMPLE_LOG), each line stamped by a watcher polling them every POLL_S. Per arm: the survivor's stall (its last
step before the kill to its first step in the smaller world), the steps trained again, the checkpoint loads, the
global batch before and after, the final validation top-1, the step time and the wall time. Goals (issue 37): ours
has the smallest stall, trains 0 steps again and keeps the global batch.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import yaml

from bench.local import REPO, VENV_BIN
from bench.restarts import dataset
from trainer.node_config import merge
from trainer.runtime.contract import CHANNEL_ENV, IN_PLACE_ENV, TRAINER_ENV
from trainer.runtime.host import channel
from trainer.runtime.host.channel import Join, Notice, ProcState, Who
from trainer.runtime.host.ports import free_port

EPOCHS = 6
BATCH = 2  # clips per process and step: 24 training videos, 6 steps an epoch on 2 processes
KILL_STEP = 8  # of 36: the second of epoch 2
CHECKPOINT_MINUTES = 0.0005  # torchrun's arm: 30 ms, a mid-epoch checkpoint at every step or so (its best case)
POLL_S = 0.02
TIMEOUT_S = 300
ARMS = ("torchrun", "torchft", "ours")
# --recipe: 3 nodes, 4 classes, 96 training videos (16 steps an epoch), 120 validation videos (top-1 in steps of
# 0.83), trained until it has learnt them: with half the videos and 20 epochs a run ended at 50 to 95 %, where one
# seed's two runs differed by up to 13 points and 3 seeds told nothing. Node 2 lost in the middle of epoch 6.
RECIPE_NODES = 3
RECIPE_EPOCHS = 30
RECIPE_KILL_STEP = 88
RECIPE_DATA = ("--classes", "left", "right", "up", "down", "--train-per-class", "24", "--val-per-class", "30")
RECIPE_SEEDS = (1, 2, 3, 4, 5, 6)
RECIPE_POINTS = 2.0
JOB = {"DDP_CONFIG": {"TIMEOUT_SECONDS": 120},
       "CONFIG": {"TRAIN": {"EPOCH_NUM": EPOCHS, "BATCH_SIZE": BATCH}, "LOG": {"SAMPLE_LOG": True, "DISPLAY_FREQ": 1}}}
RESUMED = re.compile(r"resumed from \S+ at epoch \d+, step (\d+)")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PATH": f"{VENV_BIN}:{os.environ['PATH']}"}


@dataclass
class Arm:
    """One launcher's run with the kill: what its survivor went through."""

    name: str
    stall_s: float  # the survivor's last step before the kill to its first step in the smaller world
    step_s: float  # the median step before the kill
    again: int  # steps trained again
    loads: int  # checkpoints loaded
    batch_before: int
    batch_after: int
    top1: float | None
    wall_s: float
    detect_s: float | None = None  # the failure named (None: inside the stall; 0: driven by the bench)
    note: str = ""


# ---------------------------------------------------------------------------------------------------------------------
# the sample logs, stamped as they grow


@dataclass
class Watcher:
    """Every line the sample logs under ``roots`` gain, with the moment it was seen (polled every POLL_S)."""

    roots: list[Path]
    records: list[dict[str, Any]] = field(default_factory=list)
    _seen: dict[Path, int] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.poll()
            time.sleep(POLL_S)

    def poll(self) -> None:
        now = time.time()
        for path in sorted(p for root in self.roots for p in root.glob("**/samples/*.jsonl")):
            text = path.read_text()
            done = text[: text.rfind("\n") + 1].splitlines()  # a line being written waits for its end
            for line in done[self._seen.get(path, 0):]:
                self.records.append({**json.loads(line), "t": now, "file": str(path)})
            self._seen[path] = len(done)

    def steps(self) -> int:
        return max((r["step"] for r in self.records), default=0)

    def stop(self) -> list[dict[str, Any]]:
        self._stop.set()
        self._thread.join()
        self.poll()
        return self.records


def wait(until: Callable[[], bool], procs: list[subprocess.Popen[bytes]], what: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not until():
        if time.monotonic() > deadline or any(p.poll() not in (None, 0) for p in procs):
            raise SystemExit(f"bench/elastic.py: waiting for {what}: {[p.poll() for p in procs]}")
        time.sleep(POLL_S)


def measure(name: str, records: list[dict[str, Any]], kill_at: float,
            new_world: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """The stall, steps again, batches and step time from stamped sample records; ``new_world(record)``: whether a
    record is of a step in the smaller world."""
    before = [r for r in records if r["t"] <= kill_at]
    after = sorted((r for r in records if new_world(r)), key=lambda r: r["t"])
    if not before or not after:
        raise SystemExit(f"bench/elastic.py: {name}: no step before the kill or none after it")
    last, first = max(before, key=lambda r: r["t"]), after[0]
    old_steps = sorted({(r["step"], r["t"]) for r in before if r["rank"] == last["rank"]})
    gaps = [b[1] - a[1] for a, b in itertools.pairwise(old_steps) if b[0] == a[0] + 1]
    old = [r for r in records if not new_world(r)]
    return {"stall_s": first["t"] - last["t"], "step_s": statistics.median(gaps) if gaps else 0.0,
            "again": max(r["step"] for r in old) - (first["step"] - 1),
            "batch_before": global_batch(old, last["step"]), "batch_after": global_batch(after, first["step"])}


def global_batch(records: list[dict[str, Any]], step: int) -> int:
    """Samples in optimizer step ``step`` over every rank (torchft's lines: one replica's, times the replicas)."""
    mine = {r["rank"]: r for r in records if r["step"] == step}
    if any("replicas" in r for r in mine.values()):
        return max(len(r["samples"]) * r["replicas"] for r in mine.values())
    return sum(len(r["samples"]) for r in mine.values())


def listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def config(data: Path, out: Path, name: str, **extra: Any) -> Path:
    """configs/i3d_cpu_test.yaml with the job's settings, the dataset and ``name``'s own run directory."""
    experiment = yaml.safe_load((REPO / "configs" / "i3d_cpu_test.yaml").read_text())
    local = {"CONFIG": {"DATA": {"TRAIN_ANNO_PATH": str(data / "train.txt"), "TRAIN_DATA_PATH": str(data),
                                 "VAL_ANNO_PATH": str(data / "val.txt"), "VAL_DATA_PATH": str(data)},
                        "LOG": {"BASE_PATH": str(out), "EXP_NAME": name}}}
    path = out / f"{name}.yaml"
    path.write_text(yaml.safe_dump(merge(merge(merge(experiment, JOB), local), extra)))
    return path


def final_top1(run: Path) -> float | None:
    found = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    vals = [r["val_top1"] for r in found if "epoch" in r and "val_top1" in r]
    return float(vals[-1]) if vals else None


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


# ---------------------------------------------------------------------------------------------------------------------
# torchrun


def parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def run_torchrun(data: Path, out: Path) -> Arm:
    cfg = config(data, out, "torchrun", CONFIG={"TRAIN": {"CHECKPOINT_MINUTES": CHECKPOINT_MINUTES,
                                                          "RESUME": "auto"}})
    folder = channel.make_folder(out / "torchrun-channel")  # the workers' reports: each one's rank and pid
    endpoint = f"127.0.0.1:{free_port()}"
    started = time.time()
    agents: list[subprocess.Popen[bytes]] = []
    watcher = Watcher([out / "torchrun"])
    try:
        for node in range(2):
            agents.append(subprocess.Popen(
                [str(VENV_BIN / "torchrun"), "--nnodes=1:2", "--nproc-per-node=1", "--max-restarts=3",
                 "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", "--rdzv-id=bench-elastic", "-m",
                 "trainer.train", "--config-file", str(cfg)],
                cwd=REPO, env={**ENV, CHANNEL_ENV: str(folder)}, stdout=subprocess.DEVNULL,
                stderr=(out / f"torchrun-node{node}.txt").open("w"), start_new_session=True))  # fmt: skip
            time.sleep(2.0 if node == 0 else 0.0)  # node 0's agent hosts the rendezvous store
        wait(lambda: watcher.steps() >= KILL_STEP, agents, f"torchrun: step {KILL_STEP}")
        worker = next(r.pid for r in channel.processes(folder) if r.rank == 1)
        lost = next(a for a in agents if a.pid == parent(worker))
        kill_at = time.time()
        os.killpg(lost.pid, signal.SIGKILL)
        os.kill(worker, signal.SIGKILL)  # the node lost: its agent and its worker at once
        survivor = next(a for a in agents if a is not lost)
        if survivor.wait(timeout=TIMEOUT_S) != 0:
            raise SystemExit(f"bench/elastic.py: torchrun's survivor ended with status {survivor.returncode}")
        wall = time.time() - started
    finally:
        stop(agents)
        records = watcher.stop()
    run = out / "torchrun"
    log = (run / "log.txt").read_text()
    loads = len(RESUMED.findall(log))
    kept = re.search(r"accumulation (\d+) -> (\d+).*?global batch (\d+) kept", log)
    found = measure("torchrun", records, kill_at, lambda r: r["attempt"] not in (None, 0))
    note = (f"the trainer kept the global batch on resume (accumulation {kept[1]} -> {kept[2]}); torchrun alone "
            "halves it" if kept else "torchrun alone halves the global batch")
    return Arm("torchrun", **found, loads=loads, top1=final_top1(run), wall_s=wall, note=note)


# ---------------------------------------------------------------------------------------------------------------------
# torchft


def run_torchft(data: Path, out: Path) -> Arm:
    if not (VENV_BIN / "torchft_lighthouse").exists():
        raise SystemExit("bench/elastic.py: torchft: no torchft_lighthouse (pip install -r requirements-dev.txt)")
    cfg = config(data, out, "torchft")
    port = free_port()
    # The lighthouse: a quorum of 1 allowed, stragglers waited for 1 s (its heartbeat timeout, 5 s, default).
    lighthouse = subprocess.Popen(
        [str(VENV_BIN / "torchft_lighthouse"), "--bind", f"127.0.0.1:{port}", "--min_replicas", "1",
         "--quorum_tick_ms", "100", "--join_timeout_ms", "1000"], stdout=subprocess.DEVNULL,
        stderr=(out / "torchft-lighthouse.txt").open("w"), start_new_session=True)
    wait(lambda: listening(port), [lighthouse], "torchft: its lighthouse")
    started = time.time()
    replicas: list[subprocess.Popen[bytes]] = []
    run = out / "torchft"
    run.mkdir()
    watcher = Watcher([run])
    try:
        for replica in range(2):
            replicas.append(subprocess.Popen(
                [str(VENV_BIN / "python"), "-m", "bench.elastic", "--torchft-replica", str(replica), "--config",
                 str(cfg), "--lighthouse", f"http://127.0.0.1:{port}"], cwd=REPO, env=ENV, stdout=subprocess.DEVNULL,
                stderr=(out / f"torchft-replica{replica}.txt").open("w"), start_new_session=True))
        # Both replicas start together, as the trainers do at their rendezvous: else the first one in trains alone.
        wait(lambda: all((run / f"ready{r}").exists() for r in range(2)), replicas, "torchft: both replicas built")
        (run / "go").touch()
        wait(lambda: watcher.steps() >= KILL_STEP, replicas, f"torchft: step {KILL_STEP}")
        kill_at = time.time()
        os.killpg(replicas[1].pid, signal.SIGKILL)
        if replicas[0].wait(timeout=TIMEOUT_S) != 0:
            raise SystemExit(f"bench/elastic.py: torchft's survivor ended with status {replicas[0].returncode}")
        wall = time.time() - started
    finally:
        stop(replicas)
        records = watcher.stop()
        stop([lighthouse])
    result = json.loads((run / "result.json").read_text())
    found = measure("torchft", records, kill_at, lambda r: r["rank"] == 0 and r["replicas"] == 1)
    return Arm("torchft", **found, loads=result["loads"], top1=result["top1"], wall_s=wall,
               note="the survivor trains its own shard alone: the lost replica's batches are not trained")


def torchft_replica(replica: int, cfg_path: str, lighthouse: str) -> None:
    """One replica group of one process: the trainer's model, data and optimizer under torchft's Manager."""
    import torch
    import torch.distributed as dist
    from torchft import Manager, Optimizer, ProcessGroupGloo

    from trainer.accel import clip_normalizer
    from trainer.config import load_config
    from trainer.data.dataset import build_dataset
    from trainer.data.loader import build_loader, set_loader_epoch
    from trainer.distributed import DistContext
    from trainer.model_setup import build_model_from_config
    from trainer.solver import build_optimizer, build_scheduler

    cfg = load_config(cfg_path)
    torch.manual_seed(cfg.CONFIG.TRAIN.SEED)
    cpu = torch.device("cpu")
    # The loader deals the epoch out as it does to rank ``replica`` of 2: each replica trains its own half.
    ctx = DistContext(replica, 2, 0, 1, replica, 2, cpu, "gloo", True, "")
    loader = build_loader(build_dataset(cfg, "train"), cfg, "train", ctx)
    model = build_model_from_config(cfg)
    inner = build_optimizer(cfg, model, cfg.CONFIG.TRAIN.LR)
    schedule = build_scheduler(cfg, inner, len(loader))
    loads = 0

    def load_state_dict(state: dict[str, Any]) -> None:
        nonlocal loads
        loads += 1 if manager.current_step() > 0 else 0  # step 0: the initial sync, not a recovery
        model.load_state_dict(state["model"])
        inner.load_state_dict(state["optim"])
        schedule.load_state_dict(state["schedule"])

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    manager = Manager(pg=ProcessGroupGloo(timeout=timedelta(seconds=5)), min_replica_size=1,
                      load_state_dict=load_state_dict,
                      state_dict=lambda: {"model": model.state_dict(), "optim": inner.state_dict(),
                                          "schedule": schedule.state_dict()},
                      replica_id=f"replica{replica}", lighthouse_addr=lighthouse, store_addr="127.0.0.1",
                      store_port=store.port, rank=0, world_size=1, timeout=timedelta(seconds=30))
    optimizer = Optimizer(manager, inner)
    normalize = clip_normalizer(cfg, DistContext(0, 1, 0, 1, 0, 1, cpu, "gloo", False, ""))
    run = Path(cfg.CONFIG.LOG.BASE_PATH) / cfg.CONFIG.LOG.EXP_NAME
    log = run / "samples" / f"replica{replica}.jsonl"
    log.parent.mkdir(parents=True, exist_ok=True)
    (run / f"ready{replica}").touch()
    while not (run / "go").exists():
        time.sleep(0.01)
    for epoch in range(cfg.CONFIG.TRAIN.EPOCH_NUM):
        set_loader_epoch(loader, epoch)
        model.train()
        for batch in loader:
            optimizer.zero_grad()  # starts the step's quorum
            loss = torch.nn.functional.cross_entropy(model(normalize(batch["video"], batch.get("crops"))),
                                                     batch["label"])
            loss.backward()
            # Each gradient averaged over the healthy replicas by the Manager (as torchft's PureDistributedDataParallel
            # does): torchft.ddp.DistributedDataParallel's comm hook fails an assertion when a peer dies (0.2.0).
            for work in [manager.allreduce(p.grad) for p in model.parameters() if p.grad is not None]:
                work.wait()  # a failure is the Manager's: the step is then not committed
            before = manager.current_step()
            optimizer.step()  # only when every healthy replica's gradients were averaged
            if manager.current_step() > before:
                schedule.step()
                with log.open("a") as file:
                    file.write(json.dumps({"step": manager.current_step(), "epoch": epoch, "rank": replica,
                                           "replicas": manager.num_participants(),
                                           "samples": [int(i) for i in batch["index"]]}) + "\n")
    if replica == 0:
        model.eval()
        right = total = 0
        with torch.no_grad():
            for batch in build_loader(build_dataset(cfg, "val"), cfg, "val", None):
                right += int((model(normalize(batch["video"], batch.get("crops"))).argmax(1) == batch["label"]).sum())
                total += len(batch["label"])
        (run / "result.json").write_text(json.dumps({"loads": loads, "top1": 100.0 * right / total}))
    manager.shutdown(wait=False)


# ---------------------------------------------------------------------------------------------------------------------
# ours: restart in place, the supervisors played by the bench


@dataclass
class OursRun:
    run: Path  # rank 0's run directory
    kill_at: float | None
    records: list[dict[str, Any]]
    wall_s: float


def train_ours(data: Path, out: Path, name: str, nodes: int, lose: bool, kill_step: int = KILL_STEP,
               **extra: Any) -> OursRun:
    """``python -m trainer.train`` on ``nodes`` one-process nodes with restart in place; ``lose``: the last node is
    SIGKILLed after ``kill_step`` steps, and the survivors go on without it (the bench plays the supervisors' part)."""
    cfgs = [config(data, out, f"{name}-node{rank}", **extra) for rank in range(nodes)]
    folders = [channel.make_folder(out / f"{name}-node{rank}-channel") for rank in range(nodes)]
    port = free_port()
    started = time.time()
    procs: list[subprocess.Popen[bytes]] = []
    watcher = Watcher([out / f"{name}-node{rank}" for rank in range(nodes)])
    kill_at = None
    try:
        for rank in range(nodes):
            options = ["DDP_CONFIG.DISTRIBUTED", "True",
                       *channel.attempt_overrides(rank, f"tcp://127.0.0.1:{port}", ("127.0.0.1",) * nodes)]
            procs.append(subprocess.Popen(
                [str(VENV_BIN / "python"), "-m", "trainer.train", "--config-file", str(cfgs[rank]), *options],
                cwd=REPO, env={**ENV, CHANNEL_ENV: str(folders[rank]), IN_PLACE_ENV: "1", TRAINER_ENV: "0"},
                stdout=subprocess.DEVNULL, stderr=(out / f"{name}-node{rank}.txt").open("w"),
                start_new_session=True))  # fmt: skip
        survivors = procs[:-1] if lose else procs
        if lose:
            wait(lambda: watcher.steps() >= kill_step, procs, f"{name}: step {kill_step}")
            kill_at = time.time()
            os.killpg(procs[-1].pid, signal.SIGKILL)  # the node lost, with no spare
            procs[-1].wait()
            # As each supervisor says once the hub names the loss: this attempt is over; then the next, a node fewer.
            for folder in folders[:-1]:
                channel.write(folder / channel.NOTICE_FILE, Notice(over=0, join=None))
            for folder, proc in zip(folders[:-1], survivors, strict=True):
                wait(lambda f=folder, p=proc: parked(f, p.pid), survivors, f"{name}: the survivors parked")
            told = {"attempt": 1, "cause": "lost", "node": f"node{nodes - 1}", "detected_at": kill_at,
                    "detect_s": 0.0, "failed_step": None}
            rendezvous = f"tcp://127.0.0.1:{free_port()}"
            for rank, folder in enumerate(folders[:-1]):
                join = Join(attempt=1, who=Who.SURVIVORS, rank=rank, rendezvous=rendezvous,
                            world_urls=("127.0.0.1",) * (nodes - 1), told=told)
                channel.write(folder / channel.NOTICE_FILE, Notice(over=0, join=join))
        for proc in survivors:
            if proc.wait(timeout=TIMEOUT_S) != 0:
                raise SystemExit(f"bench/elastic.py: {name}: a trainer ended with status {proc.returncode}")
        wall = time.time() - started
    finally:
        stop(procs)
        records = watcher.stop()
    return OursRun(out / f"{name}-node0", kill_at, records, wall)


def run_ours(data: Path, out: Path) -> Arm:
    done = train_ours(data, out, "ours", 2, lose=True)
    assert done.kill_at is not None
    attempts = [json.loads(line) for line in (done.run / "metrics.jsonl").read_text().splitlines()]
    # resumed_from: "memory", or the checkpoint file read
    loads = sum(1 for r in attempts if "epoch" not in r and r.get("resumed_from") not in (None, "", "memory"))
    found = measure("ours", done.records, done.kill_at, lambda r: r["attempt"] not in (None, 0))
    return Arm("ours", **found, loads=loads, top1=final_top1(done.run), wall_s=done.wall_s, detect_s=0.0,
               note="detection driven by the bench (0 s): the runtime's is in bench/restarts.py --faults")


def parked(folder: Path, pid: int) -> bool:
    report = channel.read(channel.ProcessReport, folder / f"{pid}.json")
    return report is not None and report.state == ProcState.PARKED


# ---------------------------------------------------------------------------------------------------------------------
# the recipe kept, with BatchNorm: ours with a node lost against ours uninterrupted, over seeds


@dataclass
class SeedPair:
    seed: int
    whole: float  # final validation top-1 of the uninterrupted run
    lost: float  # ... of the run that lost a node at RECIPE_KILL_STEP and went on with one fewer


def recipe(seeds: tuple[int, ...], keep: Path | None = None) -> list[SeedPair]:
    """For each seed, the job uninterrupted on RECIPE_NODES nodes and the same job with its last node lost mid-epoch
    (no spare: the survivors go on from memory, the global batch kept by accumulation). i3d_tiny has BatchNorm, whose
    statistics are per rank: the runs' weights differ, their accuracy should not."""
    pairs: list[SeedPair] = []
    with dataset(*RECIPE_DATA) as data, tempfile.TemporaryDirectory(prefix="bench-elastic-bn-") as work:
        out = keep or Path(work)
        out.mkdir(parents=True, exist_ok=True)
        for seed in seeds:
            job = {"CONFIG": {"TRAIN": {"SEED": seed, "EPOCH_NUM": RECIPE_EPOCHS}, "DATA": {"NUM_CLASSES": 4}}}
            top1 = {}
            for lose in (False, True):
                done = train_ours(data, out, f"bn{seed}-{'lost' if lose else 'whole'}", RECIPE_NODES, lose,
                                  RECIPE_KILL_STEP, **job)
                top1[lose] = final_top1(done.run)
            if top1[False] is None or top1[True] is None:
                raise SystemExit(f"bench/elastic.py: seed {seed}: a run wrote no validation top-1")
            pairs.append(SeedPair(seed, top1[False], top1[True]))
            print(json.dumps(pairs[-1].__dict__), file=sys.stderr, flush=True)
    return pairs


def recipe_table(pairs: list[SeedPair]) -> str:
    lines = ["| seed | uninterrupted top-1 % | node lost top-1 % | difference |", "|---|---|---|---|"]
    lines += [f"| {p.seed} | {p.whole:.1f} | {p.lost:.1f} | {p.lost - p.whole:+.1f} |" for p in pairs]
    whole, lost = statistics.mean(p.whole for p in pairs), statistics.mean(p.lost for p in pairs)
    lines.append(f"| mean | {whole:.1f} | {lost:.1f} | {lost - whole:+.1f} |")
    return "\n".join(lines)


def recipe_kept(pairs: list[SeedPair]) -> bool:
    """Issue 37's goal: the mean final top-1 over the seeds within RECIPE_POINTS of the uninterrupted runs'."""
    return abs(statistics.mean(p.lost for p in pairs) - statistics.mean(p.whole for p in pairs)) <= RECIPE_POINTS


# ---------------------------------------------------------------------------------------------------------------------
# the table


def compare(arms: tuple[str, ...] = ARMS, keep: Path | None = None) -> list[Arm]:
    """Every arm in turn on one dataset; an arm that cannot run ends the bench, by name. ``keep``: the runs' folder
    (their logs), else a temporary one."""
    runners = {"torchrun": run_torchrun, "torchft": run_torchft, "ours": run_ours}
    found: list[Arm] = []
    with dataset() as data, tempfile.TemporaryDirectory(prefix="bench-elastic-runs-") as work:
        out = keep or Path(work)
        out.mkdir(parents=True, exist_ok=True)
        for name in arms:
            found.append(runners[name](data, out))
            print(json.dumps(found[-1].__dict__), file=sys.stderr, flush=True)
    return found


def goals(arms: list[Arm]) -> dict[str, bool]:
    """Issue 37's goals for ours, on the measured arms."""
    ours = next(a for a in arms if a.name == "ours")
    return {"ours: the smallest stall": all(ours.stall_s <= a.stall_s for a in arms),
            "ours: 0 steps trained again": ours.again == 0,
            "ours: the global batch unchanged": ours.batch_after == ours.batch_before}


def table(arms: list[Arm]) -> str:
    head = ("arm", "stall s", "step s", "steps again", "ckpt loads", "global batch", "val top-1 %", "wall s", "detect")
    rows = [head] + [(a.name, f"{a.stall_s:.1f}", f"{a.step_s:.2f}", str(a.again), str(a.loads),
                      f"{a.batch_before} -> {a.batch_after}", "-" if a.top1 is None else f"{a.top1:.1f}",
                      f"{a.wall_s:.0f}", "in the stall" if a.detect_s is None else f"{a.detect_s:g} s (driven)")
                     for a in arms]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    parser.add_argument("--keep", type=Path, help="keep the runs (logs, sample logs) in this folder")
    parser.add_argument("--recipe", action="store_true",
                        help=f"instead: ours with BatchNorm, uninterrupted against a node lost, over seeds "
                             f"{RECIPE_SEEDS} (about 7 minutes)")
    parser.add_argument("--torchft-replica", type=int, help=argparse.SUPPRESS)  # one of torchft's replica groups
    parser.add_argument("--config", help=argparse.SUPPRESS)
    parser.add_argument("--lighthouse", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.torchft_replica is not None:
        torchft_replica(args.torchft_replica, args.config, args.lighthouse)
        return 0
    if args.recipe:
        pairs = recipe(RECIPE_SEEDS, args.keep)
        print(recipe_table(pairs))
        held = recipe_kept(pairs)
        print(f"ours: the mean top-1 within {RECIPE_POINTS:g} points: {'met' if held else 'NOT met'}")
        return 0 if held else 1
    arms = compare(tuple(args.arms), args.keep)
    print(table(arms))
    for arm in arms:
        print(f"{arm.name}: {arm.note}")
    if "ours" not in args.arms:
        return 0
    met = goals(arms)
    for goal, held in met.items():
        print(f"{goal}: {'met' if held else 'NOT met'}")
    return 0 if all(met.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
