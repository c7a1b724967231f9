"""FSDP2 against DDP: a ViT-S VideoMAE (``videomae_small``: 384 wide, 12 blocks, 22M parameters) training step in a
2-process job, each process's step time and peak memory, under DDP_CONFIG.SHARDING ddp and fsdp2 (per-block shards,
bf16 compute; and fsdp2 with FSDP_ACTIVATION_CHECKPOINTING), in the same run. The goal (issue 38): FSDP2's peak memory
per rank at most 0.6x DDP's.

Each process trains the trainer's way (accel.wrap_ddp, which shards under fsdp2) with SGD and momentum on in-memory
clips. Peak memory: on a GPU the device's peak allocation (torch.cuda.max_memory_allocated); on a CPU, gloo, the
process's peak resident size (VmHWM) less its size just before the model was built, so libraries and the
interpreter do not count; either peak is reset once the model is built and wrapped, so it is training's (the
momentum buffers included), not the full model each rank builds before sharding it. On a CPU the workers run with
MALLOC_MMAP_THRESHOLD_ at 64 KiB: glibc then gives every larger block back to the system when it is freed, so the
resident size follows the live tensors (with its default it keeps freed memory, and the peak says little).

The clip is small by default (8 frames of 112 px: 196 tokens) so that a CPU run takes minutes; at the published
16 x 224 (1,568 tokens) activations weigh more, and bf16 and checkpointing save more. With tiny clips (--frames 4
--size 64 --batch 1) the parameters, gradients and momentum dominate: what sharding divides by the ranks.

    .venv/bin/python -m bench.fsdp [--quick] [--frames 8 --size 112 --batch 2]
"""

from __future__ import annotations

import argparse
import importlib
import json
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
from trainer.distributed import DistContext
from trainer.models.hf_video import build_hf_model
from trainer.runtime.host.ports import free_port

MODEL, CLASSES = "videomae_small", 400
SETTINGS: dict[str, dict[str, Any]] = {
    "ddp": {},
    "fsdp2": {"SHARDING": "fsdp2"},
    "fsdp2_checkpointing": {"SHARDING": "fsdp2", "FSDP_ACTIVATION_CHECKPOINTING": True},
}


def _resident_bytes() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _reset_peak(device: torch.device) -> None:
    """From here on the peak counts (not the model's building and sharding, whose copies are freed by then)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    else:
        Path("/proc/self/clear_refs").write_text("5")  # the peak resident size (VmHWM) starts again from now


def _peak_bytes(device: torch.device, before: int) -> int:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    status = Path("/proc/self/status").read_text()
    hwm = next(line for line in status.splitlines() if line.startswith("VmHWM:"))
    return int(hwm.split()[1]) * 1024 - before


def _worker(rank: int, world: int, port: int, ddp: dict[str, Any], shape: tuple[int, int, int], steps: int,
            out: str) -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    backend = "nccl" if cuda else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    cfg = validate_config({"DDP_CONFIG": {"DIST_BACKEND": backend, **ddp}})
    ctx = DistContext(rank, world, rank, world, 0, 1, device, backend, True, "")
    frames, size, batch = shape
    importlib.import_module("transformers")  # the library's own memory is not the model's
    before = _resident_bytes()
    model = build_hf_model(MODEL, CLASSES, num_frames=frames, image_size=size)
    model = wrap_ddp(model if ddp else model.to(device), ctx, cfg)  # FSDP2 moves the shards (trainer.train)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    clips = torch.randn(batch, 3, frames, size, size, device=device)
    labels = torch.randint(0, CLASSES, (batch,), device=device)
    _reset_peak(device)
    start = 0.0
    for step in range(steps + 2):
        if step == 2:  # after the first steps (DDP's buckets, the momentum buffers)
            dist.barrier()
            start = time.perf_counter()
        loss = nn.functional.cross_entropy(model(clips).float(), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    step_s = (time.perf_counter() - start) / steps
    Path(out, f"rank{rank}.json").write_text(json.dumps({"step_s": step_s, "peak": _peak_bytes(device, before)}))
    dist.destroy_process_group()


def measure(ddp: dict[str, Any], shape: tuple[int, int, int], steps: int) -> dict[str, float]:
    """Mean step time and the largest peak memory (MiB) over the 2 processes of a job with DDP_CONFIG ``ddp``."""
    with tempfile.TemporaryDirectory() as out:
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", str(64 * 1024))  # read by the spawned interpreters' glibc
        mp.spawn(_worker, args=(2, free_port(), ddp, shape, steps, out), nprocs=2, join=True)
        ranks = [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(2)]
    return {"step_s": sum(r["step_s"] for r in ranks) / 2, "peak_mib": max(r["peak"] for r in ranks) / 2**20}


def run(quick: bool, shape: tuple[int, int, int] = (8, 112, 2)) -> dict[str, Any]:
    steps = 3 if quick else 10
    return {"model": f"{MODEL}, batch {shape[2]} of {shape[0]}x{shape[1]}x{shape[1]}",
            **{name: measure(ddp, shape, steps) for name, ddp in SETTINGS.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--frames", type=int, default=8)
    parser.add_argument("--size", type=int, default=112)
    parser.add_argument("--batch", type=int, default=2)
    args = parser.parse_args()
    print(json.dumps(run(args.quick, (args.frames, args.size, args.batch)), indent=1))


if __name__ == "__main__":
    main()
