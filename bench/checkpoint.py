"""What checkpointing costs training, measured against baselines in the same run.

1. How long a checkpoint of SlowFast 8x8 R50 with its SGD momentum (264 MiB) holds up training: the extra time of a
   stretch of training steps (bench.ddp's model, one thread) with a checkpoint after its first step, over the same
   steps without one, when the trainer writes it (trainer.checkpoint.CheckpointWriter: the loop copies the state
   into CPU memory, a thread writes it through a temp file, fsync and rename while the steps go on) and when it is
   saved synchronously (the same write in the loop: what the trainer did before). Both write into $TMPDIR (keep it
   on a disk, not tmpfs); plain, synchronous and background stretches alternate; medians of a few rounds. The
   background write's own time (copy to file on disk, overlapping the steps) is shown too.
2. The per-step agreement (trainer.coordination.StepControl.agree: one all-reduce of three integers after every
   optimizer step) in a 2-process gloo DDP job training bench.ddp's model, against that job's training step, both
   timed step by step in the same run. The ranks meet at a barrier before each agreement, so its time is the
   all-reduce's own, not the wait for a slower rank (which the next gradient all-reduce would wait for anyway).

    .venv/bin/python -m bench.checkpoint [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from bench.ddp import BATCH, CLIP, MODEL
from trainer.accel import wrap_ddp
from trainer.checkpoint import CheckpointWriter, save_checkpoint
from trainer.config import validate_config
from trainer.coordination import StepControl, StopRequest
from trainer.data.transforms import ClipNormalizer
from trainer.distributed import DistContext
from trainer.models import build_model
from trainer.runtime.host.ports import free_port

SAVED_MODEL = "slowfast_8x8_resnet50_kinetics400"


def _training_state() -> dict[str, Any]:
    """A checkpoint's bulk: the model and SGD's momentum buffers (made by one step of zero gradients)."""
    torch.manual_seed(0)
    model = build_model(SAVED_MODEL, num_classes=400)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for param in model.parameters():
        param.grad = torch.zeros_like(param)
    optimizer.step()
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": 1}


def _trainer(seed: int = 0) -> Any:
    """One training step of bench.ddp's model in this process (one thread): what a checkpoint interrupts."""
    torch.manual_seed(seed)
    model = build_model(MODEL, num_classes=10)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    criterion, normalizer = nn.CrossEntropyLoss(), ClipNormalizer((0.45,) * 3, (0.225,) * 3)
    gen = torch.Generator().manual_seed(seed)
    clips = torch.randint(0, 256, (BATCH, 3, *CLIP), generator=gen, dtype=torch.uint8)
    labels = torch.randint(0, 10, (BATCH,), generator=gen)

    def step() -> None:
        criterion(model(normalizer(clips)), labels).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def _steps(step: Any, count: int, save: Any = None) -> list[float]:
    """Seconds of each of ``count`` training steps, ``save`` called after the first (inside its time)."""
    times = []
    for i in range(count):
        start = time.perf_counter()
        step()
        if i == 0 and save is not None:
            save()
        times.append(time.perf_counter() - start)
    return times


def save_delay(rounds: int, steps: int) -> dict[str, float]:
    """How long a checkpoint holds up a stretch of training steps, saved synchronously and in the background (the
    write overlapping the steps after it): each stretch's steps beyond its own median step (so a slower moment of
    the shared machine does not count), medians over rounds; and the background write's own time."""
    torch.set_num_threads(1)
    state, step = _training_state(), _trainer()
    _steps(step, 3)  # warm up
    held: dict[str, list[float]] = {"synchronous": [], "background": [], "written": []}
    with tempfile.TemporaryDirectory(prefix="bench-checkpoint-") as folder:  # on disk, as $TMPDIR is
        writer = CheckpointWriter(Path(folder), keep_last=1)
        for i in range(rounds):
            sync = _steps(step, steps, lambda i=i: save_checkpoint(state, Path(folder), 0, False, 1, step=2 * i))
            background = _steps(step, steps, lambda i=i: writer.submit(state, 0, step=2 * i + 1))
            if writer.busy():
                raise RuntimeError("the background write outlasted the steps measured: measure more steps")
            writer.wait()
            for name, times in (("synchronous", sync), ("background", background)):
                typical = statistics.median(times)
                held[name].append(sum(t - typical for t in times))
            held["written"].append(writer.last_write_s)
        size = max(p.stat().st_size for p in Path(folder).glob("*.pth")) / 2**20  # one checkpoint
    return {**{name: statistics.median(times) for name, times in held.items()}, "mib": size}


def _agreement_worker(rank: int, world: int, port: int, steps: int, out: str) -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    cfg = validate_config({"CONFIG": {"TRAIN": {"BATCH_SIZE": BATCH}}})
    ctx = DistContext(rank, world, rank, world, 0, 1, torch.device("cpu"), "gloo", True, "")
    model = wrap_ddp(build_model(MODEL, num_classes=10), ctx, cfg)
    control = StepControl(ctx, 0.0, StopRequest())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    criterion, normalizer = nn.CrossEntropyLoss(), ClipNormalizer((0.45,) * 3, (0.225,) * 3)
    gen = torch.Generator().manual_seed(rank)
    clips = torch.randint(0, 256, (BATCH, 3, *CLIP), generator=gen, dtype=torch.uint8)
    labels = torch.randint(0, 10, (BATCH,), generator=gen)
    step_s, agree_s = [], []
    for step in range(steps + 3):
        start = time.perf_counter()
        criterion(model(normalizer(clips)), labels).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        trained = time.perf_counter()
        dist.barrier()
        agreed = time.perf_counter()
        control.agree(BATCH)
        if step >= 3:  # after DDP has built its graph and buckets
            step_s.append(trained - start)
            agree_s.append(time.perf_counter() - agreed)
    Path(out, f"rank{rank}").write_text(f"{statistics.median(step_s)} {statistics.median(agree_s)}")
    dist.destroy_process_group()


def agreement_cost(steps: int) -> dict[str, float]:
    """Median training step and agreement, in seconds, of a 2-process job (the mean of its ranks' medians)."""
    with tempfile.TemporaryDirectory() as out:
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        mp.spawn(_agreement_worker, args=(2, free_port(), steps, out), nprocs=2, join=True)
        medians = [tuple(map(float, Path(out, f"rank{r}").read_text().split())) for r in range(2)]
    return {"step": statistics.mean(m[0] for m in medians), "agree": statistics.mean(m[1] for m in medians)}


def run(quick: bool) -> dict[str, Any]:
    rounds, steps = (3, 20) if quick else (5, 60)
    return {"save": save_delay(rounds, 12), "agreement": agreement_cost(steps),
            "saved_model": SAVED_MODEL,
            "trained_model": f"{MODEL}, batch {BATCH} of {CLIP[0]}x{CLIP[1]}x{CLIP[2]}"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    print(run(parser.parse_args().quick))


if __name__ == "__main__":
    main()
