"""Multigrid training against the baseline: the same epochs of the same task, wall time and final accuracy, in the
same run.

The task is the synthetic motion dataset (trainer/data/synthetic.py: a square moving left or right, told apart only
by motion) at 96 px, 16-frame clips, a small I3D, one process (python -m trainer.train's own worker, in this
process). Multigrid runs both cycles; its long-cycle stages split the epochs in thirds. Validation runs once, after
the last epoch, in both runs; startup is the same in both.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from trainer.config import validate_config
from trainer.data import make_synthetic_dataset
from trainer.distributed import launch
from trainer.reporting import read_metrics
from trainer.runtime.contract import METRICS_FILE
from trainer.train import train_worker

SIZE, FRAMES = 96, 16


def config(data: dict[str, Any], run: Path, epochs: int, multigrid: bool) -> Any:
    third = epochs // 3
    cycles = {"USE_SHORT_CYCLE": True, "USE_LONG_CYCLE": True, "LONG_CYCLE_EPOCH": [third - 1, 2 * third - 1]}
    return validate_config({
        "DDP_CONFIG": {"DISTRIBUTED": False, "DIST_BACKEND": "gloo"},
        "CONFIG": {
            "TRAIN": {"EPOCH_NUM": epochs, "BATCH_SIZE": 4, "LR": 0.05, "LR_POLICY": "Cosine", "SEED": 0,
                      "RESUME": "", **({"MULTIGRID": cycles} if multigrid else {})},
            "VAL": {"FREQ": epochs, "BATCH_SIZE": 8},
            "DATA": {**data, "CLIP_LEN": FRAMES, "FRAME_RATE": 1, "CROP_SIZE": SIZE, "SHORT_SIDE_SIZE": SIZE,
                     "NEW_HEIGHT": SIZE, "NEW_WIDTH": SIZE, "SCALE_JITTER": [1.0, 1.0], "RANDOM_FLIP": False,
                     "TEST_NUM_SEGMENT": 1, "TEST_NUM_CROP": 1},
            "MODEL": {"NAME": "i3d_tiny"},
            "LOG": {"BASE_PATH": str(run), "EXP_NAME": "", "LEVEL": "WARNING", "DISPLAY_FREQ": 1000,
                    "SAVE_FREQ": epochs},
        },
    })


def train(data: dict[str, Any], run: Path, epochs: int, multigrid: bool) -> tuple[float, float]:
    """(wall seconds, final validation top-1) of one run."""
    cfg = config(data, run, epochs, multigrid)
    start = time.perf_counter()
    launch(train_worker, cfg)
    seconds = time.perf_counter() - start
    return seconds, read_metrics(run / METRICS_FILE)[-1]["val_top1"]


def run(quick: bool) -> dict[str, Any]:
    torch.set_num_threads(1)
    epochs, videos = (6, (32, 8)) if quick else (12, (32, 8))  # per class; synthetic.py encodes <= ~80 at once
    with tempfile.TemporaryDirectory() as tmp:
        data = make_synthetic_dataset(Path(tmp) / "data", ("left", "right"), videos, size=SIZE, frames=FRAMES,
                                      fps=8, seed=0)
        base_s, base_top1 = train(data, Path(tmp) / "baseline", epochs, multigrid=False)
        mg_s, mg_top1 = train(data, Path(tmp) / "multigrid", epochs, multigrid=True)
    return {"epochs": epochs, "baseline_s": base_s, "multigrid_s": mg_s, "baseline_top1": base_top1,
            "multigrid_top1": mg_top1}
