"""The trainer's own cost in a video-transformer training step: its step (trainer.engine.train_one_epoch, the
optimizer from trainer.solver.build_optimizer, the step clock trainer.train.start_clock attaches) against a plain
PyTorch loop, on the same model and the same clips, in the same process and run. The goal (issue 38): ours at most
1.05x the plain loop's step time.

The model: transformers' VideoMAE classifier, ViT-S wide (384) but 4 blocks, on 8 frames of 112 px (196 tokens),
sized for a 2-core CPU; both copies are built by trainer.models.hf_video.build_hf_model from the same seed (a run
builds it through the registry, which takes no size overrides). One process, no DDP on either side (a 1-process run
does not wrap the model). The plain loop: AdamW with the same settings, cross-entropy,
``loss.backward(); opt.step(); opt.zero_grad()``, on the clips already normalised; ours takes the uint8 clips as a
loader hands them over and normalises them in its step (the trainer's work, counted against it), logs every step
(LOG.DISPLAY_FREQ 1, the default) and steps its LR schedule. Not counted: trainer.train's after-step callback
(checkpoint agreement, status), which needs a whole run.

Rounds alternate ours and the plain loop (after a warm-up of each); each round's step time is its wall time over its
steps (ours: one train_one_epoch over those steps, its per-epoch work included); the medians are compared.

    .venv/bin/python -m bench.hf_step [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainer.accel import clip_normalizer, grad_scaler, prepare_model
from trainer.config import Config, validate_config
from trainer.distributed import DistContext
from trainer.engine import EpochTally, TrainState, train_one_epoch
from trainer.models.hf_video import build_hf_model
from trainer.reporting import Reporter
from trainer.solver import build_optimizer, build_scheduler
from trainer.train import start_clock

MODEL, CLASSES, FRAMES, SIZE, BATCH, LAYERS = "videomae_small", 400, 8, 112, 2, 4
LR, WEIGHT_DECAY = 1e-3, 0.05
GOAL = 1.05  # ours over the plain loop's step time


def _config() -> Config:
    return validate_config({"CONFIG": {
        "TRAIN": {"OPTIMIZER": "AdamW", "LR": LR, "W_DECAY": WEIGHT_DECAY, "BATCH_SIZE": BATCH, "AMP": "off"},
        "DATA": {"NUM_CLASSES": CLASSES, "CLIP_LEN": FRAMES, "CROP_SIZE": SIZE},
        "MODEL": {"NAME": MODEL},
    }})


def _model() -> nn.Module:
    torch.manual_seed(0)
    return build_hf_model(MODEL, CLASSES, num_frames=FRAMES, image_size=SIZE, num_hidden_layers=LAYERS)


# A side of the comparison: its model, and what takes n steps and returns the seconds per step.
Side = tuple[nn.Module, Callable[[int], float]]


def ours(cfg: Config, ctx: DistContext, batch: dict[str, Any], out: Path) -> Side:
    """Steps through the trainer's epoch loop (one epoch of n batches)."""
    model = prepare_model(_model(), cfg)
    optimizer = build_optimizer(cfg, model, LR)
    state = TrainState(optimizer, build_scheduler(cfg, optimizer, 1000), grad_scaler(ctx.device, "off"))
    state.clock = start_clock(model, ctx, 0, cfg.CONFIG.TRAIN.CHECKPOINT_MINUTES)
    reporter = Reporter(ctx, out, out / "tb", 1, 1000, True)

    def steps(n: int) -> float:
        start = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):  # the epoch's progress bar
            train_one_epoch(model, [batch] * n, state, ctx, cfg, 0, reporter, EpochTally.start(ctx.device),
                            lambda tally, clips, end: None)
        return (time.perf_counter() - start) / n

    return model, steps


def plain(video: torch.Tensor, labels: torch.Tensor) -> Side:
    model = _model()
    model.train()
    train = _config().CONFIG.TRAIN
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(train.MOMENTUM, train.ADAM_BETA2), eps=train.ADAM_EPS,
                            weight_decay=WEIGHT_DECAY)

    def steps(n: int) -> float:
        start = time.perf_counter()
        for _ in range(n):
            loss = nn.functional.cross_entropy(model(video), labels)
            loss.backward()
            opt.step()
            opt.zero_grad()
        return (time.perf_counter() - start) / n

    return model, steps


def sides(out: Path) -> tuple[Side, Side]:
    """Ours and the plain loop, on the same model (same weights) and the same batch; ``out``: the run folder ours
    reports into."""
    cfg = _config()
    ctx = DistContext(0, 1, 0, 1, 0, 1, torch.device("cpu"), "gloo", False, "")
    gen = torch.Generator().manual_seed(0)
    clips = torch.randint(0, 256, (BATCH, 3, FRAMES, SIZE, SIZE), dtype=torch.uint8, generator=gen)
    labels = torch.randint(0, CLASSES, (BATCH,), generator=gen)
    batch = {"video": clips, "label": labels, "bad": [], "fallback": []}
    return ours(cfg, ctx, batch, out), plain(clip_normalizer(cfg, ctx)(clips), labels)


def run(quick: bool) -> dict[str, Any]:
    """Median seconds per step of ours and of the plain loop over interleaved rounds."""
    torch.set_num_threads(1)
    rounds, per_round = (6, 2) if quick else (15, 3)
    with tempfile.TemporaryDirectory() as out:
        (_, ours_steps), (_, plain_steps) = sides(Path(out))
        ours_steps(2), plain_steps(2)  # warm-up: allocator, AdamW's state
        times: dict[str, list[float]] = {"ours": [], "plain": []}
        for _ in range(rounds):
            times["ours"].append(ours_steps(per_round))
            times["plain"].append(plain_steps(per_round))
    return {"model": f"VideoMAE 384 wide, {LAYERS} blocks, batch {BATCH} of {FRAMES}x{SIZE}x{SIZE}",
            "rounds": rounds, "steps_per_round": per_round,
            **{name: statistics.median(t) for name, t in times.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    print(json.dumps(run(parser.parse_args().quick), indent=1))


if __name__ == "__main__":
    main()
