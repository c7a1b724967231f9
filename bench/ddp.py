"""DDP efficiency: training steps/s of one process against each process of a 2-process gloo job, same per-process
batch, in the same run.

Each process trains the trainer's way (accel.wrap_ddp: static graph, gradients as bucket views; the engine's step:
uint8 clips normalised on the device, loss and top-1 summed there, no host sync in the step) on in-memory clips, so
the figure is the model step and its all-reduce, not decoding. One thread per process: the 1-process baseline uses
one core, the job two. This machine has 2 cores shared with other work, so the two processes also compete with
whatever else runs; the ratio is what a job loses to gradient all-reduce and to sharing the machine. A third figure
separates the two: two independent single-process runs side by side (no DDP, the same sharing of the machine).
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from trainer.accel import wrap_ddp
from trainer.config import validate_config
from trainer.data.transforms import ClipNormalizer
from trainer.distributed import DistContext
from trainer.models import build_model
from trainer.runtime.host.ports import free_port

MODEL, BATCH, CLIP = "i3d_tiny", 4, (16, 112, 112)  # a small I3D on 16 x 112 x 112 clips: ~0.1 s a step on one core


def _worker(rank: int, world: int, distributed: bool, port: int, steps: int, out: str) -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    if distributed:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    cfg = validate_config({"CONFIG": {"TRAIN": {"BATCH_SIZE": BATCH}}})
    ctx = DistContext(rank, world, rank, world, 0, 1, torch.device("cpu"), "gloo", distributed, "")
    model = wrap_ddp(build_model(MODEL, num_classes=10), ctx, cfg)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    criterion = nn.CrossEntropyLoss()
    normalizer = ClipNormalizer((0.45,) * 3, (0.225,) * 3)
    gen = torch.Generator().manual_seed(rank)
    clips = torch.randint(0, 256, (BATCH, 3, *CLIP), generator=gen, dtype=torch.uint8)
    labels = torch.randint(0, 10, (BATCH,), generator=gen)
    sums = torch.zeros(2, dtype=torch.float64)
    start = 0.0
    for step in range(steps + 3):
        if step == 3:  # after the first steps (DDP builds its static graph and buckets)
            start = time.perf_counter()
        logits = model(normalizer(clips))
        loss = criterion(logits, labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sums += torch.stack([loss.detach().double(), (logits.argmax(1) == labels).sum().double()])
    rate = steps / (time.perf_counter() - start)
    Path(out, f"rank{rank}").write_text(str(rate))
    if distributed:
        dist.destroy_process_group()


def steps_per_second(world: int, steps: int, distributed: bool = True) -> float:
    """Mean steps/s of ``world`` processes training side by side: one DDP job, or (not ``distributed``) as many
    independent single-process runs, which share the machine the same way but never communicate."""
    with tempfile.TemporaryDirectory() as out:
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        mp.spawn(_worker, args=(world, distributed and world > 1, free_port(), steps, out), nprocs=world, join=True)
        rates = [float(Path(out, f"rank{r}").read_text()) for r in range(world)]
    return sum(rates) / len(rates)


def run(quick: bool) -> dict[str, Any]:
    """Each setting in turn, for a few rounds (a busy moment of the shared machine hits them alike); mean rates."""
    steps, rounds = (10, 1) if quick else (20, 3)
    settings = {"one": (1, True), "two": (2, True), "two_alone": (2, False)}
    rates = dict.fromkeys(settings, 0.0)
    for _ in range(rounds):
        for name, (world, distributed) in settings.items():
            rates[name] += steps_per_second(world, steps, distributed) / rounds
    return {**rates, "model": f"{MODEL}, batch {BATCH} of {CLIP[0]}x{CLIP[1]}x{CLIP[2]}"}
