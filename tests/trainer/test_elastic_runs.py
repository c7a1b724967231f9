"""The recipe kept when the world shrinks (trainer/elastic.py), on real ``python -m trainer.train`` processes with gloo
on the synthetic videos: a model whose BatchNorm is frozen (MODEL.BN_EVAL) and without dropout, launched on 3 ranks
(global batch 3 x 2 = 6), loses one mid-epoch and ends on 2 (accumulation 1 -> 2: micro-batches of 2 and 1 clips)
with the final weights of the uninterrupted 3-rank run, to float tolerance (every step trains the same 6 samples, each
weighing 1/6; only the order of the sums differs); and each training video is trained once per epoch, counted from
the trainers' own sample logs (LOG.SAMPLE_LOG).

Two ways to the smaller world: restart in place (this test the nodes' supervisors, as tests/trainer/test_in_place.py:
the lost node killed, the survivors handed an attempt of 2 nodes; they go on from memory, no checkpoint loaded), and
a 3-rank run stopped mid-epoch by a signal, resumed from its checkpoint on 2 ranks (the rest of the epoch dealt out
again).
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

from tests.trainer.test_resume import finish, start, wait_for
from tests.trainer.test_train import REPO, free_port, run_trainer, write_config
from trainer.runtime.contract import CHANNEL_ENV, IN_PLACE_ENV, TRAINER_ENV
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

    def start(self, rank: int, port: int, urls: tuple[str, ...]) -> subprocess.Popen[str]:
        # WORLD_SIZE from the attempt's overrides, as a trainer started for it (a standby) gets it.
        options = ["DDP_CONFIG.DISTRIBUTED", "True", "DDP_CONFIG.TIMEOUT_SECONDS", str(COLLECTIVE_TIMEOUT_S),
                   "CONFIG.DATA.DECODE_TIME_LIMIT", "5",
                   *channel.attempt_overrides(rank, f"tcp://127.0.0.1:{port}", urls)]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "trainer.train", "--config-file", str(self.cfg), *options], cwd=REPO,
            env={**os.environ, "OMP_NUM_THREADS": "1", CHANNEL_ENV: str(self.channel), IN_PLACE_ENV: "1",
                 TRAINER_ENV: "0"},
            start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        return self.proc

    def parked(self) -> bool:
        assert self.proc is not None
        report = channel.read(channel.ProcessReport, self.channel / f"{self.proc.pid}.json")
        return report is not None and report.state == ProcState.PARKED

    def steps(self) -> int:
        path = self.run / "samples" / "rank0.jsonl"
        return len(path.read_text().splitlines()) if path.is_file() else 0


def test_a_rank_lost_mid_epoch_the_survivors_go_on_from_memory_on_2_ranks_with_the_recipe_kept(
    synthetic_dataset: dict[str, Any], reference: Path, tmp_path: Path
) -> None:
    nodes = [Node(synthetic_dataset, tmp_path, rank) for rank in range(3)]
    port = free_port()
    procs = [node.start(rank, port, ("127.0.0.1",) * 3) for rank, node in enumerate(nodes)]
    survivors = procs[:2]
    try:
        wait_for(lambda: nodes[0].steps() >= 6, procs, "step 6 (mid-epoch 2) on rank 0")
        os.killpg(procs[2].pid, signal.SIGKILL)  # the node lost, with no spare
        procs[2].communicate()
        told_at = time.monotonic()
        for node in nodes[:2]:  # as their supervisors say once the hub names the loss
            channel.write(node.channel / channel.NOTICE_FILE, Notice(over=0, join=None))
        for node in nodes[:2]:
            wait_for(node.parked, survivors, f"{node.run.name} parked")
        parked_s = time.monotonic() - told_at
        port = free_port()
        told = {"attempt": 1, "cause": "lost", "node": "node2", "detected_at": 0.0, "detect_s": 0.0,
                "failed_step": None}
        for rank, node in enumerate(nodes[:2]):
            join = Join(attempt=1, who=Who.SURVIVORS, rank=rank, rendezvous=f"tcp://127.0.0.1:{port}",
                        world_urls=("127.0.0.1",) * 2, told=told)
            channel.write(node.channel / channel.NOTICE_FILE, Notice(over=0, join=join))
        codes = [finish(proc) for proc in survivors]
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
    for rank, (_, _, err) in enumerate(codes):
        (tmp_path / f"stderr{rank}.txt").write_text(err)
    assert [code for code, _, _ in codes] == [0, 0], [err[-3000:] for _, _, err in codes]
    assert parked_s < COLLECTIVE_TIMEOUT_S / 4, parked_s  # within LEAVE_S of the word, not at the timeout
    output = codes[0][1] + codes[0][2]
    assert "continued from memory at step" in output, output[-3000:]
    assert "accumulation 1 -> 2 micro-batch(es) of at most 2 clip(s) per rank and step; global batch 6 kept" in output
    attempts = [json.loads(line) for line in (nodes[0].run / "metrics.jsonl").read_text().splitlines()]
    attempts = [r for r in attempts if "attempt" in r and "epoch" not in r]
    assert [r["resumed_from"] for r in attempts] == ["memory"], attempts
    resumed = attempts[0]["resumed_step"]
    assert 6 <= resumed < 8  # in epoch 2 (steps 5-8)
    assert_close_weights(nodes[0].run, reference)
    # The lost rank's record of a step the survivors did not complete (a step is complete when all ranks have it)
    # is not the job's: the survivors trained that step again, in the new world.
    records = [r for r in sample_records([node.run for node in nodes])
               if r["attempt"] == 1 or r["step"] <= resumed]
    assert {r["world"] for r in records if r["step"] > resumed} == {2}
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
