"""The recipe kept when the world shrinks and grows back (trainer/elastic.py), on real ``python -m trainer.train``
processes with gloo on the synthetic videos: a model whose BatchNorm is frozen (MODEL.BN_EVAL) and without dropout,
launched on 3 ranks (global batch 3 x 2 = 6), loses one mid-epoch and goes on on 2 (accumulation 1 -> 2: micro-batches
of 2 and 1 clips), with the final weights of the uninterrupted 3-rank run, to float tolerance (every step trains the
same 6 samples, each weighing 1/6; only the order of the sums differs); and each training video is trained once per
epoch, counted from the trainers' own sample logs (LOG.SAMPLE_LOG).

Two ways to the smaller world: restart in place (this test the nodes' supervisors, as tests/trainer/test_in_place.py:
the lost node killed, the survivors handed an attempt of 2 nodes; they go on from memory, no checkpoint loaded; later
a process new to the job joins them as rank 2 from rank 0's memory: trainer.continuation.shared_memory), and a 3-rank
run stopped mid-epoch by a signal, resumed from its checkpoint on 2 ranks (the rest of the epoch dealt out again).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.ports import free_port
from tests.trainer.test_resume import finish, start, wait_for
from tests.trainer.test_train import REPO, run_trainer, write_config
from trainer.runtime.contract import ATTEMPT_ENV, CHANNEL_ENV, IN_PLACE_ENV, TRAINER_ENV
from trainer.runtime.host import channel
from trainer.runtime.host.channel import Join, Notice, ProcState, Who

EPOCHS = 3  # 24 training videos: 4 steps of 6 an epoch
TRAIN_VIDEOS = 24
# A long collective timeout: a survivor waiting in a gloo collective on a live peer that left the attempt must leave it
# at its supervisor's word (trainer.distributed.abort_groups shuts the group's connections), not wait this out.
COLLECTIVE_TIMEOUT_S = 120


def elastic_config(data: dict[str, Any], tmp: Path, name: str, workers: int) -> Path:
    return write_config(tmp / f"{name}.yaml", data, tmp / name, workers=workers,
                        TRAIN={"EPOCH_NUM": EPOCHS, "BATCH_SIZE": 2}, MODEL={"NAME": "i3d_tiny", "BN_EVAL": True,
                                                                             "DROPOUT_RATE": 0.0},
                        LOG={"SAMPLE_LOG": True, "DISPLAY_FREQ": 1})


def final_weights(run: Path) -> dict[str, torch.Tensor]:
    return torch.load(run / "checkpoints" / f"epoch_{EPOCHS:04d}.pth", weights_only=False)["model"]


def assert_close_weights(run: Path, reference: Path) -> None:
    got, want = final_weights(run), final_weights(reference)
    assert got.keys() == want.keys()
    for name, tensor in want.items():
        torch.testing.assert_close(got[name], tensor, rtol=1e-4, atol=1e-5, msg=name)
    assert any(not torch.equal(got[n], t) for n, t in want.items() if t.is_floating_point())  # not the same run


def sample_records(runs: list[Path]) -> list[dict[str, Any]]:
    return [json.loads(line) for run in runs for path in sorted((run / "samples").glob("rank*.jsonl"))
            for line in path.read_text().splitlines()]


def assert_each_sample_once_per_epoch(records: list[dict[str, Any]]) -> None:
    for epoch in range(EPOCHS):
        seen = Counter(i for r in records if r["epoch"] == epoch for i in r["samples"])
        assert seen == Counter(range(TRAIN_VIDEOS)), (epoch, seen)


@pytest.fixture(scope="module")
def reference(synthetic_dataset: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The job uninterrupted on its 3 ranks."""
    tmp = tmp_path_factory.mktemp("elastic-reference")
    run_trainer("-m", "trainer.train", "--config-file", elastic_config(synthetic_dataset, tmp, "run", 3))
    assert_each_sample_once_per_epoch(sample_records([tmp / "run"]))
    return tmp / "run"


class Node:
    """One node of one process: its config (its own run directory) and its channel."""

    def __init__(self, data: dict[str, Any], tmp: Path, rank: int) -> None:
        self.cfg = elastic_config(data, tmp, f"node{rank}", 1)
        self.run = tmp / f"node{rank}"
        self.channel = channel.make_folder(tmp / f"node{rank}-channel")
        self.proc: subprocess.Popen[str] | None = None

    def start(self, rank: int, port: int, urls: tuple[str, ...], env: dict[str, str] | None = None
              ) -> subprocess.Popen[str]:
        # WORLD_SIZE from the attempt's overrides, as a trainer started for it (a standby) gets it.
        options = ["DDP_CONFIG.DISTRIBUTED", "True", "DDP_CONFIG.TIMEOUT_SECONDS", str(COLLECTIVE_TIMEOUT_S),
                   "CONFIG.DATA.DECODE_TIME_LIMIT", "5",
                   *channel.attempt_overrides(rank, f"tcp://127.0.0.1:{port}", urls)]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "trainer.train", "--config-file", str(self.cfg), *options], cwd=REPO,
            env={**os.environ, "OMP_NUM_THREADS": "1", CHANNEL_ENV: str(self.channel), IN_PLACE_ENV: "1",
                 TRAINER_ENV: "0", **(env or {})},  # TRAINER_ENV: the attempt it is started for
            start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        return self.proc

    def parked(self) -> bool:
        assert self.proc is not None
        report = channel.read(channel.ProcessReport, self.channel / f"{self.proc.pid}.json")
        return report is not None and report.state == ProcState.PARKED

    def steps(self) -> int:
        """The steps this node's rank has recorded (its one samples file)."""
        return sum(len(path.read_text().splitlines()) for path in (self.run / "samples").glob("rank*.jsonl"))


def hand_attempt(nodes: list[Node], attempt: int, told: dict[str, Any]) -> tuple[int, tuple[str, ...]]:
    """As the nodes' supervisors do once the hub starts ``attempt`` on ``nodes`` (in rank order): the rendezvous and
    the addresses; the parked trainers among them are handed it in their channel."""
    port, urls = free_port(), ("127.0.0.1",) * len(nodes)
    for rank, node in enumerate(nodes):
        if node.proc is not None and node.proc.poll() is None:
            join = Join(attempt=attempt, who=Who.SURVIVORS, rank=rank, rendezvous=f"tcp://127.0.0.1:{port}",
                        world_urls=urls, told=told)
            channel.write(node.channel / channel.NOTICE_FILE, Notice(over=attempt - 1, join=join))
    return port, urls


def park(nodes: list[Node], attempt: int, procs: list[subprocess.Popen[str]]) -> float:
    """Tell ``nodes`` their attempt is over, as their supervisors do; the seconds until all parked."""
    told_at = time.monotonic()
    for node in nodes:
        channel.write(node.channel / channel.NOTICE_FILE, Notice(over=attempt, join=None))
    for node in nodes:
        wait_for(node.parked, procs, f"{node.run.name} parked")
    return time.monotonic() - told_at


def told(attempt: int, cause: str, node: str) -> dict[str, Any]:
    return {"attempt": attempt, "cause": cause, "node": node, "detected_at": 0.0, "detect_s": 0.0,
            "failed_step": None}


def test_a_rank_lost_mid_epoch_the_survivors_go_on_on_2_ranks_then_a_new_one_joins_from_a_peers_memory(
    synthetic_dataset: dict[str, Any], reference: Path, tmp_path: Path
) -> None:
    """3 ranks; rank 2 killed in epoch 2: the survivors go on from memory on 2 (accumulation 1 -> 2); in epoch 3 a
    process new to the job (a spare, or the lost node back) joins as rank 2: it receives the model and optimizer
    state from rank 0's memory (no checkpoint read anywhere) and the accumulation returns to 1. The weights end as the
    uninterrupted 3-rank run's, and every sample is trained once per epoch."""
    nodes = [Node(synthetic_dataset, tmp_path, rank) for rank in range(3)]
    port = free_port()
    procs = [node.start(rank, port, ("127.0.0.1",) * 3) for rank, node in enumerate(nodes)]
    survivors = nodes[:2]
    try:
        # Killed once it has recorded step 6 itself: a rank killed between a step's all-reduce and its record of it
        # leaves that step done with no record of its samples (CI saw it once).
        wait_for(lambda: nodes[0].steps() >= 6 and nodes[2].steps() >= 6, procs, "step 6 (mid-epoch 2) on ranks 0, 2")
        os.killpg(procs[2].pid, signal.SIGKILL)  # the node lost, with no spare
        procs[2].communicate()
        parked_s = park(survivors, 0, procs[:2])
        hand_attempt(survivors, 1, told(1, "lost", "node2"))
        wait_for(lambda: nodes[0].steps() >= 10, procs[:2], "step 10 (mid-epoch 3) on rank 0")
        park(survivors, 1, procs[:2])
        spare = Node(synthetic_dataset, tmp_path, 3)
        port, urls = hand_attempt([*survivors, spare], 2, told(2, "joined", "node3"))
        started_for = {TRAINER_ENV: "2", ATTEMPT_ENV: json.dumps(told(2, "joined", "node3"))}  # as its node starts it
        procs.append(spare.start(2, port, urls, started_for))
        codes = [finish(proc) for proc in (procs[0], procs[1], procs[3])]
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
    for rank, (_, _, err) in enumerate(codes):
        (tmp_path / f"stderr{rank}.txt").write_text(err)
    assert [code for code, _, _ in codes] == [0, 0, 0], [err[-3000:] for _, _, err in codes]
    assert parked_s < COLLECTIVE_TIMEOUT_S / 4, parked_s  # within LEAVE_S of the word, not at the timeout
    output, joined = codes[0][1] + codes[0][2], codes[2][1] + codes[2][2]
    assert "continued from memory at step" in output, output[-3000:]
    assert "accumulation 1 -> 2 micro-batch(es) of at most 2 clip(s) per rank and step; global batch 6 kept" in output
    assert "the attempt before had 2): accumulation 2 -> 1 micro-batch(es)" in output, output[-3000:]
    assert "from rank 0's memory, no checkpoint read" in joined and "resumed from" not in joined, joined[-3000:]
    attempts = [json.loads(line) for line in (nodes[0].run / "metrics.jsonl").read_text().splitlines()]
    attempts = [r for r in attempts if "attempt" in r and "epoch" not in r]
    assert [r["resumed_from"] for r in attempts] == ["memory", "memory"], attempts
    shrunk, grown = (r["resumed_step"] for r in attempts)
    assert 6 <= shrunk < 8 and 10 <= grown < 12, attempts  # in epoch 2 (steps 5-8), and in epoch 3 (steps 9-12)
    assert_close_weights(nodes[0].run, reference)
    # A rank's record of a step its attempt did not complete on every rank (the lost rank's, or a survivor's when it
    # was told to leave) is not the job's: the next attempt trained that step again.
    went_on = {0: shrunk, 1: grown}
    records = [r for r in sample_records([node.run for node in [*nodes, spare]])
               if r["attempt"] not in went_on or r["step"] <= went_on[r["attempt"]]]
    assert {r["world"] for r in records if shrunk < r["step"] <= grown} == {2}
    assert {r["world"] for r in records if r["step"] > grown} == {3}
    assert_each_sample_once_per_epoch(records)


def test_a_3_rank_run_stopped_mid_epoch_resumes_on_2_ranks_from_its_checkpoint_with_the_recipe_kept(
    synthetic_dataset: dict[str, Any], reference: Path, tmp_path: Path
) -> None:
    cfg = elastic_config(synthetic_dataset, tmp_path, "run", 3)
    run = tmp_path / "run"
    proc = start(cfg)
    wait_for(lambda: (run / "samples" / "rank0.jsonl").is_file()
             and len((run / "samples" / "rank0.jsonl").read_text().splitlines()) >= 6, [proc], "step 6")
    os.killpg(proc.pid, signal.SIGTERM)  # every rank checkpoints at its next step
    code, _, err = finish(proc)
    assert code == 75, err[-3000:]
    resumed = run_trainer("-m", "trainer.train", "--config-file", cfg, "DDP_CONFIG.CPU_WORKERS", "2",
                          "CONFIG.TRAIN.RESUME", "auto")
    output = resumed.stdout + resumed.stderr
    assert "resumed from" in output and "mid-epoch" in output, output[-3000:]
    assert "accumulation 1 -> 2" in output, output[-3000:]
    assert_close_weights(run, reference)
    assert_each_sample_once_per_epoch(sample_records([run]))
