"""Clip frame-index sampling as in GluonCV's VideoClsDataset.

A clip is CLIP_LEN frames taken FRAME_RATE apart (span = (CLIP_LEN - 1) * FRAME_RATE + 1 frames). The video is
cut into NUM_SEGMENT equal segments and one clip is placed in each; the clips are concatenated along time.
Where a clip starts inside its segment is a fraction in [0, 1] of the starts that fit: random for training, 0.5
(centre) for validation, and for the test views what the recipe's source does (see `temporal_view_positions`). A
segment shorter than the span starts its clip as late as still fits in the video; indices past the last frame
are clamped to it, so a short video is padded by repeating its last frame.
"""

from __future__ import annotations

import numpy as np


def clip_span(clip_len: int, frame_rate: int) -> int:
    """Frames covered by one clip from its first to its last sampled frame."""
    return (clip_len - 1) * frame_rate + 1


def clip_indices(
    num_frames: int, clip_len: int, frame_rate: int, num_segment: int, positions: np.ndarray
) -> np.ndarray:
    """Frame indices [num_segment * clip_len] (int64); positions[k] in [0, 1] places the clip in segment k."""
    if num_frames < 1:
        raise ValueError("video has no frames")
    span = clip_span(clip_len, frame_rate)
    bounds = np.linspace(0, num_frames, num_segment + 1).astype(np.int64)
    room = bounds[1:] - bounds[:-1] - span  # free frames left in each segment after one clip
    fits = bounds[:-1] + np.minimum((positions * (room + 1)).astype(np.int64), room)
    # Short segment: the clip runs into the next one, but not off the end of the video (GluonCV overlaps too).
    starts = np.where(room >= 0, fits, np.clip(np.minimum(bounds[:-1], num_frames - span), 0, None))
    offsets = np.arange(clip_len, dtype=np.int64) * frame_rate
    return np.minimum(starts[:, None] + offsets[None, :], num_frames - 1).reshape(-1)


def train_indices(
    num_frames: int, clip_len: int, frame_rate: int, num_segment: int, rng: np.random.Generator
) -> np.ndarray:
    """Random clip start within each segment."""
    return clip_indices(num_frames, clip_len, frame_rate, num_segment, rng.random(num_segment))


def val_indices(num_frames: int, clip_len: int, frame_rate: int, num_segment: int) -> np.ndarray:
    """Clip centred in each segment."""
    return clip_indices(num_frames, clip_len, frame_rate, num_segment, np.full(num_segment, 0.5))


def temporal_view_positions(num_views: int, recipe: str) -> list[float]:
    """Where each temporal test view starts, as a fraction of the starts that fit (0 = first frame, 1 = as late as
    the clip fits).

    gluoncv: evenly from the very start to the very end, v / (N - 1) (GluonCV's VideoClsDataset test mode; a single
    view, which GluonCV's formula cannot place, is the centred validation clip). pyslowfast: v / N, PySlowFast's
    ``decoder.get_start_end_idx`` without offset sampling (a single view starts at the first frame).
    """
    if num_views < 1:
        raise ValueError(f"need at least one temporal view, got {num_views}")
    if recipe == "pyslowfast":
        return [v / num_views for v in range(num_views)]
    return [0.5] if num_views == 1 else [v / (num_views - 1) for v in range(num_views)]


def view_indices(
    num_frames: int, clip_len: int, frame_rate: int, num_segment: int, position: float
) -> np.ndarray:
    """A test view: the clip of each segment placed at ``position`` (from `temporal_view_positions`)."""
    return clip_indices(num_frames, clip_len, frame_rate, num_segment, np.full(num_segment, position))
