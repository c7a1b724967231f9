"""Restart in place, the trainer's side (trainer/inplace.py), with this test as the nodes' supervisors: two nodes of
one process each (real gloo, the synthetic H.264 videos), each with its channel folder (trainer.runtime.host.channel).

A process whose attempt ends under it (its peer killed, or its supervisor's word) parks: its group torn down, its
interpreter, model and loaders kept; handed the next attempt, it forms the new group and resumes from the checkpoint.
A killed node's next attempt runs in its standby (imported beforehand). Every run ends with the weights and epoch
records of one uninterrupted run, bit for bit.

A parked process aborts its groups (trainer.distributed.abort_groups) rather than destroying them: on nccl a graceful
destroy waits on the dead peer. The same code parks on gloo here and on nccl with two GPUs (skipped without them).
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.ports import free_port
from tests.trainer.gpus import needs, visible_env
from tests.trainer.test_resume import EVERY_STEP, assert_same_run, config, digests, finish, uninterrupted, wait_for
from tests.trainer.test_train import REPO
from trainer import inplace
from trainer.inplace import InPlace
from trainer.runtime.contract import (
    ATTEMPT_ENV,
    CHANNEL_ENV,
    EXIT_PEER_LOST,
    IN_PLACE_ENV,
    NCCL_ERROR_HANDLING,
    NCCL_ERROR_HANDLING_ENV,
    PARENT_ENV,
    STANDBY_ENV,
    TRAINER_ENV,
)
from trainer.runtime.host import channel
from trainer.runtime.host.channel import Join, Notice, ProcessReport, ProcState, Who
from trainer.timeline import Timeline

__all__ = ["uninterrupted"]
URLS = ("127.0.0.1", "127.0.0.1")


class Node:
    """One node: its config (its own run directory), its channel, its trainer and its standby."""

    def __init__(self, data: dict[str, Any], tmp: Path, rank: int) -> None:
        self.name = f"node{rank}"
        self.cfg = config(data, tmp, self.name, minutes=EVERY_STEP)
        self.run = tmp / self.name
        self.channel = channel.make_folder(tmp / f"{self.name}-channel")
        self.proc: subprocess.Popen[str] | None = None

    def popen(self, argv: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-m", "trainer.train", "--config-file", str(self.cfg),
                                 "DDP_CONFIG.CPU_WORKERS", "1", "DDP_CONFIG.WORLD_SIZE", "2", *argv], cwd=REPO,
                                env={**os.environ, "OMP_NUM_THREADS": "1", CHANNEL_ENV: str(self.channel),
                                     IN_PLACE_ENV: "1", **env},
                                start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def start(self, rank: int, port: int) -> None:
        self.proc = self.popen(channel.attempt_overrides(rank, f"tcp://127.0.0.1:{port}", URLS), {TRAINER_ENV: "0"})

    def standby(self) -> subprocess.Popen[str]:
        return self.popen([], {TRAINER_ENV: "standby", STANDBY_ENV: "1"})

    def report(self, pid: int) -> ProcessReport | None:
        return channel.read(ProcessReport, self.channel / f"{pid}.json")

    def tell(self, over: int, join: Join | None = None) -> None:
        channel.write(self.channel / channel.NOTICE_FILE, Notice(over=over, join=join))

    def in_state(self, pid: int, state: ProcState) -> bool:
        report = self.report(pid)
        return report is not None and report.state == state


def join(rank: int, port: int, who: Who) -> Join:
    told = {"attempt": 1, "cause": "killed", "node": "node1", "detected_at": time.time(), "detect_s": 0.5,
            "failed_step": None}
    return Join(attempt=1, who=who, rank=rank, rendezvous=f"tcp://127.0.0.1:{port}", world_urls=URLS, told=told)


def kill(procs: list[subprocess.Popen[str]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()


# Killed after a mid-epoch checkpoint of epoch 2, or once epoch 1's checkpoint is written (the new attempt goes on from
# an epoch's start: the RNG states its start set, not the reseed after the step before).
KILL_AFTER = {"mid-epoch": "epoch_0001_step_*.pth", "epoch end": "epoch_0001.pth"}


@pytest.mark.parametrize("at", KILL_AFTER)
def test_a_survivor_goes_on_in_place_and_the_killed_node_in_its_standby(
    synthetic_dataset: dict[str, Any], uninterrupted: Path, tmp_path: Path, at: str
) -> None:
    nodes = [Node(synthetic_dataset, tmp_path, rank) for rank in (0, 1)]
    port = free_port()
    for rank, node in enumerate(nodes):
        node.start(rank, port)
    standby = nodes[1].standby()
    first, second = nodes[0].proc, nodes[1].proc
    assert first is not None and second is not None
    procs = [first, second, standby]
    try:
        wait_for(lambda: any((nodes[1].run / "checkpoints").glob(KILL_AFTER[at])), procs, f"{at} on node 1")
        wait_for(lambda: nodes[1].in_state(standby.pid, ProcState.STANDBY), procs, "node 1's standby")
        os.killpg(second.pid, signal.SIGKILL)  # node 1's trainer and its loader worker
        second.communicate()
        wait_for(lambda: nodes[0].in_state(first.pid, ProcState.PARKED), [first, standby], "node 0's trainer parked")
        port = free_port()
        handed = time.time()
        nodes[0].tell(0, join(0, port, Who.SURVIVORS))
        nodes[1].tell(0, join(1, port, Who.STANDBY))
        codes = [finish(first), finish(standby)]
    finally:
        kill(procs)
    assert [code for code, _, _ in codes] == [0, 0], [err[-3000:] for _, _, err in codes]
    out = codes[0][1]
    assert "attempt 0 is over (PeerError" in codes[0][2] or "attempt 0 is over (" in out, out[-3000:]
    assert f"joining attempt 1 in place as node rank 0, rendezvous tcp://127.0.0.1:{port}" in codes[0][2] + out
    # The standby held nothing in memory: it received node 0's (trainer.continuation.shared_memory), so nothing was
    # trained twice, and the weights end as the uninterrupted run's (every rank's randomness after a step depends on
    # the run's history alone: trainer.elastic.continuation_seed). The epoch's training metrics lack the killed rank's
    # part of it.
    assert "rank 1 joined at step" in codes[1][2] and "from rank 0's memory" in codes[1][2], codes[1][2][-3000:]
    assert "resumed from" not in out + codes[0][2] + codes[1][2]
    assert digests(nodes[0].run) == digests(uninterrupted)
    survivor, spare = nodes[0].report(first.pid), nodes[1].report(standby.pid)
    assert survivor is not None and spare is not None
    for report in (survivor, spare):  # both timelines of attempt 1, in order, after the handover
        assert report.attempt == 1 and report.state == ProcState.TRAINING, report
        times = [report.phases[phase] for phase in channel.PHASES]
        assert handed - 1 <= times[0] and times == sorted(times), report
    assert spare.phases["imported"] == spare.phases["started"]  # its imports were done before it was handed over
    # Each says its accumulation (the world of 2 is the launch's: 1); the survivor, which went on in place, its last
    # step in attempt 0: its pause is on record (the standby took no step before)
    assert (survivor.micro_batches, spare.micro_batches, spare.step_before) == (1, 1, None), (survivor, spare)
    assert survivor.step_before is not None and survivor.step_before < handed, survivor
    records = [r for r in map(json.loads, (nodes[0].run / "metrics.jsonl").read_text().splitlines()) if "attempt" in r]
    assert [r["attempt"] for r in records] == [1] and records[0]["cause"] == "killed", records
    assert records[0]["resumed_from"] == "memory", records


def test_told_their_attempt_is_over_both_park_and_go_on_in_place_with_their_ranks_swapped(
    synthetic_dataset: dict[str, Any], uninterrupted: Path, tmp_path: Path
) -> None:
    """The supervisors' word alone (a lost hub, the no-split rule) ends the attempt; in the next one rank 0 is the
    other node: each process builds its loaders for its new shard, the store is hosted by the old rank 1, and both go
    on from memory."""
    nodes = [Node(synthetic_dataset, tmp_path, rank) for rank in (0, 1)]
    port = free_port()
    for rank, node in enumerate(nodes):
        node.start(rank, port)
    procs = [node.proc for node in nodes if node.proc is not None]
    try:
        wait_for(lambda: any((nodes[1].run / "checkpoints").glob("epoch_0001_step_*.pth")), procs,
                 "a mid-epoch checkpoint of epoch 2 on node 1")
        for node in nodes:
            node.tell(0)
        for node, proc in zip(nodes, procs, strict=True):
            wait_for(lambda node=node, proc=proc: node.in_state(proc.pid, ProcState.PARKED), procs,
                     f"{node.name} parked")
        port = free_port()
        for rank, node in zip((1, 0), nodes, strict=True):
            node.tell(0, join(rank, port, Who.SURVIVORS))
        codes = [finish(proc) for proc in procs]
    finally:
        kill(procs)
    assert [code for code, _, _ in codes] == [0, 0], [err[-3000:] for _, _, err in codes]
    assert "the supervisor says attempt 0 is over" in codes[0][1] + codes[0][2]
    # both held the same step: no checkpoint read; each took the RNG states, sums and BatchNorm statistics of the
    # rank whose number it now has, so the run is still the uninterrupted one
    assert "continued from memory at step" in codes[1][1] + codes[1][2]
    assert_same_run(nodes[1].run, uninterrupted)  # node 1 had rank 0 at the end: it wrote the digests
    assert json.loads((nodes[1].run / "weights_digest.json").read_text())["identical"]


def _gone(pid: int) -> bool:
    """The process ended (a zombie nobody reaped counts as ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_a_standby_whose_supervisor_died_while_it_imported_ends(tmp_path: Path) -> None:
    # The supervisor (here a shell) starts the standby and dies at once, long before the standby's imports are done;
    # the standby, reparented by then, must still see that nobody will hand it an attempt, and end.
    folder = channel.make_folder(tmp_path / "channel")
    script = (f'{PARENT_ENV}=$$ {STANDBY_ENV}=1 {CHANNEL_ENV}="$1" {IN_PLACE_ENV}=1 "$2" -m trainer.train '
              '>/dev/null 2>&1 & echo $!')
    pid = int(subprocess.run(["sh", "-c", script, "supervisor", str(folder), sys.executable], cwd=REPO,
                             capture_output=True, text=True, check=True).stdout)
    try:
        deadline = time.monotonic() + 120
        while not _gone(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _gone(pid), "the standby still waits for an attempt 120 s after its supervisor died"
    finally:
        if not _gone(pid):
            os.kill(pid, signal.SIGKILL)


def test_a_parked_survivor_is_not_handed_the_attempt_it_left_again(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Parked out of attempt 1, a survivor finds the supervisor's notice that handed it attempt 1 still there: it keeps
    waiting (here until it is stopped) and takes only a later attempt."""
    monkeypatch.delenv(CHANNEL_ENV, raising=False)
    monkeypatch.delenv(PARENT_ENV, raising=False)
    monkeypatch.setenv(TRAINER_ENV, "1")  # restored after the test: taking an attempt sets it, as ATTEMPT_ENV
    monkeypatch.setenv(ATTEMPT_ENV, "{}")
    monkeypatch.setattr(inplace, "PROCESS", Timeline())  # this test's process account, written nowhere
    folder = channel.make_folder(tmp_path / "channel")

    def hand(attempt: int) -> None:
        channel.write(folder / channel.NOTICE_FILE,
                      Notice(over=1, join=dataclasses.replace(join(0, 5000, Who.SURVIVORS), attempt=attempt)))

    hand(1)
    looks = iter([False, False, True])  # it looks at the notice three times, then is stopped
    with pytest.raises(inplace.ParentGone):
        InPlace(str(folder)).next_attempt(1, lambda: next(looks))
    hand(2)
    deadline = time.monotonic() + 30
    taken = InPlace(str(folder)).next_attempt(1, lambda: time.monotonic() > deadline)
    assert taken.attempt == 2 and os.environ[TRAINER_ENV] == "2"


# A process training attempt 0, in its step's gradient all-reduce, told it is over: the leave watch aborts its groups
# (here: says so) LEAVE_S later. Its main thread then either stays where it is (argv "stuck": a gloo send on a failed
# connection waits out the group's timeout), or catches what ended its attempt ("leaves") and takes its time to park,
# or waits for its loader's next batch for longer than STUCK_S ("loads": a slow batch, no hang), then leaves.
TOLD_TO_LEAVE = """
import os, sys, time
from trainer import heartbeat, inplace
from trainer.runtime.host import channel
from trainer.runtime.host.channel import Notice
from trainer.runtime.watch.messages import DATA
inplace.STUCK_S = 1.0
inplace.PROCESS.begin(0)
heartbeat.at(heartbeat.GRADIENTS)
folder = os.environ["VIDCLUSTER_TEST_CHANNEL"]
place = inplace.InPlace(folder)
place.abort_when_over(lambda: print("aborted", flush=True))
channel.write(os.path.join(folder, channel.NOTICE_FILE), Notice(over=0, join=None))
if sys.argv[1] == "leaves":
    time.sleep(inplace.LEAVE_S + inplace.STUCK_S / 2)  # after the abort, before the watch would end it
    place.leaving()
if sys.argv[1] == "loads":
    heartbeat.at(DATA)
    time.sleep(inplace.LEAVE_S + 3 * inplace.STUCK_S)
    heartbeat.at(heartbeat.GRADIENTS)  # its batch came: its step's all-reduce fails at once
    time.sleep(inplace.STUCK_S / 2)
    place.leaving()
time.sleep(inplace.LEAVE_S + 2 * inplace.STUCK_S)
print("parked", flush=True)
"""


@pytest.mark.parametrize("main_thread", ["stuck", "leaves", "loads"])
def test_a_rank_still_in_its_attempt_after_the_abort_ends_itself_and_one_that_left_parks(
        tmp_path: Path, main_thread: str) -> None:
    folder = channel.make_folder(tmp_path / "channel")
    env = {k: v for k, v in os.environ.items() if k not in (CHANNEL_ENV, TRAINER_ENV)}
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-c", TOLD_TO_LEAVE, main_thread], cwd=REPO, capture_output=True,
                          text=True, timeout=60, env={**env, "VIDCLUSTER_TEST_CHANNEL": str(folder)})
    took = time.monotonic() - began
    assert done.stdout.split() == (["aborted"] if main_thread == "stuck" else ["aborted", "parked"]), done
    if main_thread == "stuck":
        assert done.returncode == EXIT_PEER_LOST and took < 30, (took, done)
        assert "still in it 1 s after its process groups were aborted" in done.stderr, done.stderr
    else:
        assert done.returncode == 0 and "ending this process" not in done.stderr, done


# Two ranks form a group; rank 1 dies after the first all-reduce; rank 0's next collective fails (gloo: at once; nccl:
# when the restart-in-place watch's abort (another thread, as InPlace.abort_when_over) ends it), rank 0 parks as a
# parked trainer does (abort_groups) and forms a group again, alone. It prints how long each part took.
PEER_DIES = """
import datetime, json, os, sys, threading, time
import torch, torch.distributed as dist
from trainer.distributed import abort_groups
rank, backend, port = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
if backend == "nccl":
    torch.cuda.set_device(device)
dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                        timeout=datetime.timedelta(seconds=300))
tensor = torch.ones(1, device=device)
dist.all_reduce(tensor)
if device.type == "cuda":
    torch.cuda.synchronize()
if rank == 1:
    os._exit(3)
time.sleep(1)  # rank 1 is gone
began = time.monotonic()
if backend == "nccl":
    threading.Timer(2.0, abort_groups).start()
try:
    dist.all_reduce(tensor)
    if device.type == "cuda":
        torch.cuda.synchronize()
    failed = ""
except Exception as exc:
    failed = type(exc).__name__
lost_s = time.monotonic() - began
began = time.monotonic()
abort_groups()
parked_s = time.monotonic() - began
dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port + 1}", rank=0, world_size=1)
dist.all_reduce(tensor)
if device.type == "cuda":
    torch.cuda.synchronize()
print(json.dumps({"failed": failed, "lost_s": lost_s, "parked_s": parked_s, "initialized": dist.is_initialized()}))
os._exit(0)
"""


def peer_dies(backend: str, env: dict[str, str]) -> dict[str, Any]:
    """PEER_DIES on two processes: what rank 0 printed."""
    port = free_port()
    ranks = [subprocess.Popen([sys.executable, "-c", PEER_DIES, str(rank), backend, str(port)], cwd=REPO,
                              env={**os.environ, "OMP_NUM_THREADS": "1", **env}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, start_new_session=True) for rank in (0, 1)]
    try:
        (out, err), _ = ranks[0].communicate(timeout=120), ranks[1].communicate(timeout=120)
    finally:
        kill(ranks)
    assert ranks[0].returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def test_a_survivor_parks_by_aborting_its_group_at_once_on_gloo() -> None:
    figures = peer_dies("gloo", {})
    assert figures["failed"] and figures["lost_s"] < 10, figures  # the dead peer's connection closed
    assert figures["parked_s"] < 2 and figures["initialized"], figures


def test_a_survivor_parks_by_aborting_its_group_at_once_on_nccl(gpus: list[str]) -> None:
    """The same parking on nccl, where a graceful destroy waits on the dead peer: the survivor's collective ends at
    the abort, and it forms its next group seconds later, not after the stop grace or TIMEOUT_SECONDS."""
    figures = peer_dies("nccl", {**visible_env(needs(gpus, 2)), NCCL_ERROR_HANDLING_ENV: NCCL_ERROR_HANDLING})
    assert figures["lost_s"] < 30, figures  # the collective ended (it may end without raising once aborted)
    assert figures["parked_s"] < 10 and figures["initialized"], figures
