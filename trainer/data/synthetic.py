"""A labelled synthetic H.264 dataset whose classes can only be told apart by motion.

Each video shows a bright square drifting over a textured, flickering background. The class is the direction
of motion ('left', 'right', 'up', 'down'); the start position is random and the square wraps around the frame
edges, so any single frame is equally likely under every class and a model has to look at several frames.

Frames are made with numpy and piped to one ffmpeg process as raw RGB (no temporary images).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from trainer.data.annotations import write_class_index

# Pixels moved per frame along each class's axis (dy, dx).
DIRECTIONS: dict[str, tuple[int, int]] = {"left": (0, -1), "right": (0, 1), "up": (-1, 0), "down": (1, 0)}
SPLITS = ("train", "val")


def render_video(direction: tuple[int, int], size: int, frames: int, rng: np.random.Generator) -> np.ndarray:
    """Frames [T, H, W, 3] uint8 of a square moving `direction` * speed pixels per frame (wrapping around)."""
    texture = rng.integers(40, 120, size=(size, size, 3), dtype=np.int16)
    flicker = rng.integers(-12, 13, size=(frames, size, size, 3), dtype=np.int16)
    video = np.clip(texture[None] + flicker, 0, 255).astype(np.uint8)
    side = max(4, size // 5)
    speed = int(rng.integers(1, 3)) * max(1, size // 32)
    y0, x0 = (int(v) for v in rng.integers(0, size, size=2))
    colour = rng.integers(200, 256, size=3, dtype=np.uint8)
    span = np.arange(side)
    for t in range(frames):
        rows = (y0 + direction[0] * speed * t + span) % size
        cols = (x0 + direction[1] * speed * t + span) % size
        video[t][np.ix_(rows, cols)] = colour
    return video


def encode_mp4s(videos: Sequence[np.ndarray], paths: Sequence[Path], fps: int) -> None:
    """Encode same-shaped frame arrays [T, H, W, 3] uint8 to H.264 .mp4 files with a single ffmpeg process.

    Starting ffmpeg costs far more than encoding a few tiny frames, so all videos go through one raw-RGB
    pipe and the segment muxer cuts them apart at forced key frames.
    """
    frames, height, width, _ = videos[0].shape
    cuts = ",".join(str(frames * i) for i in range(1, len(videos))) or str(frames)
    # A key frame at every video's first frame: one term, whatever the count (a sum of eq(n, start) terms, one per
    # video, grew past what ffmpeg's expression parser takes at about 130 videos).
    starts = f"not(mod(n,{frames}))"
    with tempfile.TemporaryDirectory(dir=os.path.commonpath([Path(p).parent for p in paths])) as tmp:
        cmd = [
            "ffmpeg", "-loglevel", "error", "-y",
            "-f", "rawvideo", "-pix_fmt", "rgb24", "-s", f"{width}x{height}", "-r", str(fps), "-i", "-",
            "-c:v", "libx264", "-preset", "ultrafast", "-pix_fmt", "yuv420p", "-an",
            "-force_key_frames", f"expr:{starts}",
            "-f", "segment", "-segment_frames", cuts, "-reset_timestamps", "1", f"{tmp}/%06d.mp4",
        ]  # fmt: skip
        data = b"".join(v.tobytes() for v in videos)
        proc = subprocess.run(cmd, input=data, capture_output=True, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"ffmpeg failed: {proc.stderr.decode(errors='replace').strip()}")
        for i, path in enumerate(paths):
            os.replace(f"{tmp}/{i:06d}.mp4", path)


def make_synthetic_dataset(
    root: str | Path,
    classes: Sequence[str] = ("left", "right"),
    videos_per_class: tuple[int, int] = (12, 6),
    size: int = 32,
    frames: int = 16,
    fps: int = 8,
    seed: int = 0,
) -> dict[str, str | int]:
    """Write `root/<split>/<class>/<class>_NNN.mp4`, GluonCV lists `train.txt`/`val.txt` and `classInd.txt`.

    `videos_per_class` is (train, val). Returns the CONFIG.DATA settings that point at the dataset:
    TRAIN_ANNO_PATH, TRAIN_DATA_PATH, VAL_ANNO_PATH, VAL_DATA_PATH, CLASS_INDEX (paths as str), NUM_CLASSES.
    """
    if shutil.which("ffmpeg") is None:
        raise RuntimeError("ffmpeg not found on PATH (scripts/bootstrap.sh installs it)")
    unknown = [c for c in classes if c not in DIRECTIONS]
    if unknown:
        raise ValueError(f"unknown synthetic classes {unknown}; choose from {sorted(DIRECTIONS)}")
    if size % 2:
        raise ValueError(f"size must be even for yuv420p H.264, got {size}")
    root = Path(root)
    rng = np.random.default_rng(seed)
    videos: list[np.ndarray] = []
    paths: list[Path] = []
    lines: dict[str, list[str]] = {split: [] for split in SPLITS}
    for split, count in zip(SPLITS, videos_per_class, strict=True):
        for label, name in enumerate(classes):
            (root / split / name).mkdir(parents=True, exist_ok=True)
            for i in range(count):
                rel = f"{split}/{name}/{name}_{i:03d}.mp4"
                videos.append(render_video(DIRECTIONS[name], size, frames, rng))
                paths.append(root / rel)
                lines[split].append(f"{rel} {frames} {label}\n")
    encode_mp4s(videos, paths, fps)
    for split in SPLITS:
        (root / f"{split}.txt").write_text("".join(lines[split]))
    write_class_index(root / "classInd.txt", list(classes))
    return dataset_settings(root, len(classes))


def dataset_settings(root: Path, num_classes: int) -> dict[str, str | int]:
    """The CONFIG.DATA settings of a dataset make_synthetic_dataset wrote at ``root``."""
    return {
        "TRAIN_ANNO_PATH": str(root / "train.txt"),
        "TRAIN_DATA_PATH": str(root),
        "VAL_ANNO_PATH": str(root / "val.txt"),
        "VAL_DATA_PATH": str(root),
        "CLASS_INDEX": str(root / "classInd.txt"),
        "NUM_CLASSES": num_classes,
    }
