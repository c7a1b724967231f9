"""Videos made beforehand, for a machine without ffmpeg (a bare GPU image): the GPU tests and bench/gpu_step.py read
them from $VIDCLUSTER_TEST_VIDEOS instead of encoding their own. scripts/gpu-bundle.sh makes them where ffmpeg is:

    python -m tests.trainer.prepared_videos DIR
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from trainer.data import make_synthetic_dataset

PREPARED_VIDEOS_ENV = "VIDCLUSTER_TEST_VIDEOS"
SYNTHETIC = "synthetic"  # the folders of a prepared videos folder
KINETICS_LIKE = "kinetics_like"


def make_synthetic_task(root: Path) -> dict[str, Any]:
    """Motion-only classes 'left'/'right': 12 train + 6 val H.264 videos each, 32x32, 16 frames at 8 fps."""
    return make_synthetic_dataset(root, ("left", "right"), (12, 6), size=32, frames=16, fps=8, seed=0)


def make_prepared_videos(root: Path) -> None:
    """The synthetic task and four Kinetics-like 340x256 10 s videos (bench/decoders.py's)."""
    from bench.loader import kinetics_like

    make_synthetic_task(root / SYNTHETIC)
    (root / KINETICS_LIKE).mkdir(parents=True, exist_ok=True)
    kinetics_like(root / KINETICS_LIKE, 4)


def prepared_videos() -> Path | None:
    found = os.environ.get(PREPARED_VIDEOS_ENV)
    return Path(found) if found else None


if __name__ == "__main__":
    make_prepared_videos(Path(sys.argv[1]))
