"""Check a whole dataset: open every listed video and decode its first and last frame."""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from trainer.data.annotations import read_annotations
from trainer.data.dataset import BadVideo, open_video, read_frames

CHECK_PROCESSES = 2


def probe_video(path: str) -> str | None:
    """Why the video is unusable, or None when its first and last frames decode."""
    try:
        reader = open_video(path)
        read_frames(reader, np.array([0, len(reader) - 1]))
    except BadVideo as exc:
        return str(exc)
    return None


def check_dataset(anno_path: str | Path, data_root: str | Path) -> list[tuple[str, str]]:
    """(path, reason) of every bad video in an annotation list, in list order; [] when all are fine."""
    paths = [record.path for record in read_annotations(anno_path, data_root)]
    # fork: the children only need the already-imported decoder, and spawn would re-import torch in each.
    context = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(CHECK_PROCESSES, mp_context=context) as pool:
        reasons = list(pool.map(probe_video, paths, chunksize=8))
    return [(path, reason) for path, reason in zip(paths, reasons, strict=True) if reason is not None]
