"""Check a whole dataset: open every listed video with the configured decoder and decode its first and last frame;
and, during training, stop when a whole pass could read none of its videos.

A bad video's reason ends by saying whether the other decoder reads it, so the fix is plain: switch DECODER, or
re-encode or drop the file. Each video is decoded under the config's DECODE_TIME_LIMIT, as in training: one that
runs out ("decoding took longer than N s") is bad, and not given to the other decoder (it would wait as long again).
"""

from __future__ import annotations

import functools
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import torch

from trainer.data.annotations import read_annotations
from trainer.data.decoders import BadVideo, ClipDecoder, DecoderChoice, DecoderUnavailable, DecodeTimeout, check_file
from trainer.errors import UserError

CHECK_PROCESSES = 2
# The decoder to ask about a video the configured one cannot read.
OTHER: dict[DecoderChoice, DecoderChoice] = {"decord": "torchcodec", "torchcodec": "decord", "auto": "torchcodec"}


@functools.cache
def decoder_of(choice: DecoderChoice, time_limit: float) -> ClipDecoder:
    """One decoder per choice in each checking process: its helper (the time limit's) serves every video."""
    return ClipDecoder(choice, time_limit=time_limit)


def probe_video(decoder: ClipDecoder, path: str) -> str | None:
    """Why `decoder` cannot use the video, or None when its first and last frames decode."""
    try:
        decoder.clip(path, lambda n: np.array([0, n - 1]))
    except BadVideo as exc:
        return str(exc)
    return None


def check_video(choice: DecoderChoice, time_limit: float, path: str) -> str | None:
    """None for a good video; for a bad one, the reason and whether the other decoder reads it."""
    try:
        check_file(path)
    except BadVideo as exc:
        return str(exc)  # nothing to ask another decoder
    try:
        decoder_of(choice, time_limit).clip(path, lambda n: np.array([0, n - 1]))
        return None
    except DecodeTimeout as exc:
        return str(exc)
    except BadVideo as exc:
        reason = str(exc)
    if choice == "auto" and reason.startswith("decord: "):
        return f"{reason} (neither decoder reads it)"  # auto has already tried torchcodec
    other = OTHER[choice]
    try:
        verdict = probe_video(decoder_of(other, time_limit), path)
    except DecoderUnavailable as exc:
        return f"{reason}; cannot ask {other} ({exc})"
    return f"{reason}; {other} reads it" if verdict is None else f"{reason}; {other} cannot either ({verdict})"


def check_dataset(
    anno_path: str | Path, data_root: str | Path, decoder: DecoderChoice = "decord", time_limit: float = 0.0
) -> list[tuple[str, str]]:
    """(path, reason) of every bad video in an annotation list, in list order; [] when all are fine. ``time_limit``
    (CONFIG.DATA.DECODE_TIME_LIMIT; 0: none): seconds each video may take."""
    paths = [record.path for record in read_annotations(anno_path, data_root)]
    # fork: the children only need the already-imported decoders, and spawn would re-import torch in each.
    context = multiprocessing.get_context("fork")
    # One torch thread in each child, as in DataLoader workers: a forked child must not enter the parent's
    # OpenMP thread pool (it hangs there).
    with ProcessPoolExecutor(CHECK_PROCESSES, mp_context=context, initializer=torch.set_num_threads,
                             initargs=(1,)) as pool:
        reasons = list(pool.map(functools.partial(check_video, decoder, time_limit), paths, chunksize=8))
    return [(path, reason) for path, reason in zip(paths, reasons, strict=True) if reason is not None]


class UnreadableData(UserError):
    """A whole pass over a split read none of its videos: the data is gone (unmounted, moved, unreadable), which no
    restart fixes, not a few bad files (those are skipped and counted)."""


def require_readable(list_key: str, root_key: str, epoch: int, clips: int, bad: list[tuple[str, str]]) -> None:
    """Raise UnreadableData when a pass of epoch ``epoch`` (1-based) read no clip because every video it tried was
    bad (``bad``: their (path, reason)). Training checks each rank's own pass, evaluation all ranks' together."""
    if clips or not bad:
        return
    bad = sorted(set(bad))  # a padded sample can be the same file twice
    path, reason = bad[0]
    raise UnreadableData(
        f"{list_key}: none of the {len(bad)} video(s) tried in epoch {epoch} could be read (e.g. {path}: {reason}); "
        f"check that {root_key} is in place and readable on every node (python -m trainer check-data lists them)"
    )
