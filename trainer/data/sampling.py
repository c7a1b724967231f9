"""Clip frame-index sampling as in GluonCV's VideoClsDataset.

A clip is CLIP_LEN frames taken FRAME_RATE apart (span = (CLIP_LEN - 1) * FRAME_RATE + 1 frames). The video is
cut into NUM_SEGMENT equal segments and one clip is placed in each; the clips are concatenated along time.
Where a clip starts inside its segment is a fraction in [0, 1): random for training, 0.5 (centre) for
validation, and (v + 0.5) / TEST_NUM_SEGMENT for test view v (evenly spaced, as GluonCV's test ticks). A
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
    """Frame indices [num_segment * clip_len] (int64); positions[k] in [0, 1) places the clip in segment k."""
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


def view_indices(
    num_frames: int, clip_len: int, frame_rate: int, num_segment: int, view: int, num_views: int
) -> np.ndarray:
    """Temporal test view `view` of `num_views`, evenly spaced; one view is the centred validation clip."""
    if not 0 <= view < num_views:
        raise ValueError(f"view {view} out of range for {num_views} temporal views")
    position = (view + 0.5) / num_views
    return clip_indices(num_frames, clip_len, frame_rate, num_segment, np.full(num_segment, position))
