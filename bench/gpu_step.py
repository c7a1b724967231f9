"""SlowFast 8x8 R50 training steps on one GPU: step time, data-wait fraction and peak memory, with the GPU levers
off and on, measured in the same run.

    .venv/bin/python -m bench.gpu_step [--steps 30] [--batch 8] [--workers 8] [--videos DIR] [--json FILE]

Clips as configs/slowfast.yaml trains them (32 frames at stride 2, 224 px crops), batch 8, through the trainer's own
loader (uint8 regions, pinned; crops made and normalised on the GPU, inside the measured step), model and step: SGD,
DDP-free (one process). Rows: the plain
float32 step; then AMP auto (bf16 where the GPU has it), channels_last_3d, cudnn.benchmark; then the same with
torch.compile. Data: Kinetics-like videos made here (bench/decoders.py) unless --videos names a folder of .mp4
files. Needs CUDA: on a machine without a GPU it says so and exits 0 (python -m bench shows it as skipped); the
compiled row is not measured, saying why, on a node without what torch.compile needs (trainer.hardware). --json also
writes the rows after each one (scripts/gpu-check.sh puts them in its table).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bench.gpu_check import describe
from bench.loader import kinetics_like, loader_config
from trainer.accel import autocast, clip_normalizer, configure_backends, grad_scaler, prepare_model, wrap_ddp
from trainer.config import Config
from trainer.data import build_dataset, build_loader
from trainer.data.loader import set_loader_epoch
from trainer.distributed import single_process_context
from trainer.hardware import compile_problem
from trainer.models import build_model

MODEL = "slowfast_8x8_resnet50"
NEEDS_CUDA = "needs CUDA (no GPU visible here): run it on a GPU node"


def levers(cfg: Config, on: bool, compile_model: bool) -> Config:
    train = cfg.CONFIG.TRAIN
    train.AMP, train.CHANNELS_LAST, train.CUDNN_BENCHMARK = ("auto", True, True) if on else ("off", False, False)
    train.COMPILE = compile_model
    return cfg


def measure(cfg: Config, steps: int) -> dict[str, Any]:
    """Mean step time (s), share of it spent waiting for the loader, peak GPU memory (GiB)."""
    ctx = single_process_context(cfg)
    configure_backends(cfg)
    model = wrap_ddp(prepare_model(build_model(MODEL, num_classes=400).to(ctx.device), cfg), ctx, cfg)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, nesterov=True)
    scaler = grad_scaler(ctx.device, cfg.CONFIG.TRAIN.AMP)
    criterion = nn.CrossEntropyLoss()
    normalizer = clip_normalizer(cfg, ctx)
    loader = build_loader(build_dataset(cfg, "train"), cfg, "train", ctx)
    batches = iter(_forever(loader))
    torch.cuda.reset_peak_memory_stats(ctx.device)
    waited = 0.0
    start = 0.0
    for step in range(steps + 5):
        if step == 5:  # compilation, cuDNN's search and the workers' start are behind us
            torch.cuda.synchronize(ctx.device)
            start, waited = time.perf_counter(), 0.0
        tick = time.perf_counter()
        batch = next(batches)
        waited += time.perf_counter() - tick
        with autocast(ctx, cfg.CONFIG.TRAIN.AMP):
            clips = normalizer(batch["video"], batch["crops"])  # crops made on the GPU, part of the step
            loss = criterion(model(clips), batch["label"].to(ctx.device, non_blocking=True))
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
    torch.cuda.synchronize(ctx.device)
    total = time.perf_counter() - start
    return {"step_s": total / steps, "data_wait": waited / total,
            "peak_gib": torch.cuda.max_memory_allocated(ctx.device) / 2**30}


def _forever(loader: Any) -> Any:
    epoch = 0
    while True:
        set_loader_epoch(loader, epoch)
        yield from loader
        epoch += 1


# (setting, levers on, compiled), measured in this order
SETTINGS = (("float32, no levers", False, False),
            ("AMP auto + channels_last_3d + cudnn.benchmark", True, False),
            ("the same + torch.compile", True, True))


def measured(steps: int = 30, batch: int = 8, workers: int = 8,
             videos: Path | None = None) -> Iterator[tuple[str, dict[str, Any]]]:
    """Rows (setting, measurement), each as soon as it is measured; a compiled setting on a node without what
    torch.compile needs is ``{"skipped": why}``. Raises RuntimeError(NEEDS_CUDA) without a GPU."""
    if not torch.cuda.is_available():
        raise RuntimeError(NEEDS_CUDA)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        paths = sorted(map(str, videos.glob("*.mp4"))) if videos else kinetics_like(root, 4)
        for name, on, compiled in SETTINGS:
            problem = compile_problem("cuda") if compiled else None
            if problem is not None:
                yield name, {"skipped": f"compile: not measured, {problem.split(': ', 1)[1]}"}
                continue
            cfg = loader_config(root, paths, max(64, batch * (steps + 6)), workers)
            cfg.CONFIG.TRAIN.BATCH_SIZE = batch
            yield name, measure(levers(cfg, on, compiled), steps)


def run(steps: int = 30, batch: int = 8, workers: int = 8,
        videos: Path | None = None) -> list[tuple[str, dict[str, Any]]]:
    return list(measured(steps, batch, workers, videos))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30, help="timed steps per setting")
    parser.add_argument("--batch", type=int, default=8, help="clips per step")
    parser.add_argument("--workers", type=int, default=8, help="DataLoader workers")
    parser.add_argument("--videos", type=Path, default=None, help="folder of .mp4 files to read instead")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows to this file")
    args = parser.parse_args()
    result: dict[str, Any] = {"model": MODEL, "settings": [name for name, _, _ in SETTINGS], "rows": []}
    try:
        for name, m in measured(args.steps, args.batch, args.workers, args.videos):
            if not result["rows"]:
                print(f"{MODEL}, batch {args.batch}, 32x224x224 clips, {torch.cuda.get_device_name()}")
            result["rows"].append({"setting": name, **m})
            print(f"  {name:<52} " + "  ".join(describe(m, result["rows"][0])), flush=True)
            if args.json:  # after each setting: a run cut short keeps what it measured
                args.json.write_text(json.dumps(result))
    except RuntimeError as exc:
        if str(exc) != NEEDS_CUDA:
            raise
        print(f"bench.gpu_step: {NEEDS_CUDA}")
        if args.json:
            args.json.write_text(json.dumps({**result, "skipped": NEEDS_CUDA}))


if __name__ == "__main__":
    sys.exit(main())
