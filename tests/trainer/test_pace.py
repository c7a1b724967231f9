"""The step clock (trainer/pace.py) on a real two-rank gloo DDP: the rank that computes longer is the one the other
waits for in the gradient all-reduce, the clock's hooks leave DDP's averaging as it is, and data waits and checkpoint
stalls are counted apart."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from trainer.pace import StepClock

STEPS = 8
SLOW_S = 0.06  # rank 1's extra compute per step
DATA_S = 0.02  # every rank's wait for each batch but the first
STALL_S = 0.05  # a checkpoint at step 4
EPOCH_END_S = 1.0  # between two epochs


class Slowed(nn.Module):
    def __init__(self, delay: float) -> None:
        super().__init__()
        self.layer = nn.Linear(16, 4)
        self.delay = delay

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.delay)  # a slow GPU, a noisy neighbour
        return self.layer(x)


def rank_main(rank: int, store: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    torch.manual_seed(0)
    model = DistributedDataParallel(Slowed(SLOW_S if rank == 1 else 0.0))
    clock = StepClock(torch.device("cpu"), start_step=100, checkpoint_every_s=60.0)
    clock.attach(model.module)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    clock.epoch_start()
    for step in range(STEPS):
        if step:
            time.sleep(DATA_S)  # the loader
        clock.batch_ready()
        x = torch.randn(8, 16, generator=torch.Generator().manual_seed(rank * 100 + step))
        model(x).pow(2).mean().backward()
        clock.backward_done()
        optimizer.step()
        optimizer.zero_grad()
        with clock.waiting():
            dist.barrier()  # the step's agreement
        if step == 4:
            with clock.stalled():
                time.sleep(STALL_S)
        clock.step_done()
    weights = [p.detach().sum().item() for p in model.parameters()]
    Path(out, f"{rank}.json").write_text(json.dumps({**clock.effort.__dict__, "weights": weights}))
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def efforts(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, float]]:
    folder = tmp_path_factory.mktemp("pace")
    mp.start_processes(rank_main, args=(str(folder / "store"), str(folder)), nprocs=2, start_method="fork")
    return [json.loads((folder / f"{rank}.json").read_text()) for rank in (0, 1)]


def test_the_rank_the_other_waits_for_computes_longest_and_waits_least(efforts: list[dict[str, float]]) -> None:
    fast, slow = efforts
    assert fast["steps"] == slow["steps"] == STEPS and fast["start_step"] == 100
    assert slow["compute_s"] - fast["compute_s"] > 0.6 * STEPS * SLOW_S, (fast, slow)
    assert fast["sync_s"] - slow["sync_s"] > 0.6 * STEPS * SLOW_S, (fast, slow)  # waits in the all-reduce for rank 1
    assert fast["weights"] == slow["weights"]  # DDP averaged the gradients as ever: the ranks stay equal


def test_data_waits_and_checkpoint_stalls_are_counted_apart(efforts: list[dict[str, float]]) -> None:
    for effort in efforts:
        assert (STEPS - 1) * DATA_S <= effort["data_s"] < (STEPS - 1) * DATA_S + 0.5, effort  # not the first batch
        assert STALL_S <= effort["checkpoint_s"] < STALL_S + 0.3 and effort["checkpoints"] == 1, effort
        assert effort["training_from"] > 1.7e9 and effort["checkpoint_every_s"] == 60.0


def test_an_epochs_first_batch_is_no_data_wait() -> None:
    """One process, two epochs of three steps, a long evaluation between them: only the waits for the batches after
    each epoch's first count as data waits, not the epoch's end."""
    clock = StepClock(torch.device("cpu"), start_step=0, checkpoint_every_s=0.0)
    model = nn.Linear(4, 2)
    clock.attach(model)
    for epoch in range(2):
        if epoch:
            time.sleep(EPOCH_END_S)  # the evaluation, the epoch's checkpoint
        clock.epoch_start()
        for step in range(3):
            if step:
                time.sleep(DATA_S)
            clock.batch_ready()
            model(torch.ones(1, 4)).sum().backward()
            clock.backward_done()
            clock.step_done()
    effort = clock.effort
    assert effort.steps == 6 and 4 * DATA_S <= effort.data_s < 4 * DATA_S + EPOCH_END_S / 2, effort
