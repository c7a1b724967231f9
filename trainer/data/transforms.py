"""Clip transforms: decoded uint8 frames [T, H, W, C] in (tensor, on the decoder's device, or numpy array),
normalised float [C, T, H, W] out.

Every spatial transform is one `resized_crop` on uint8: we pick the input region that would become the crop
after a short-side resize and resize only that region, which gives the same picture as resize-then-crop at a
fraction of the cost. Normalisation (the clip spec's mean/std, CONFIG.DATA.MEAN/STD) happens last, on the small crop.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torchvision.transforms.v2 import functional as TF

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def crop_positions(num_crops: int) -> list[float]:
    """Where test crops sit along the long side (0 = start, 1 = end): 1 -> centre, 3 -> left/centre/right, as
    GluonCV (split / (crops - 1)), PySlowFast (uniform_crop) and MMAction2 (ThreeCrop) place them."""
    if num_crops < 1:
        raise ValueError(f"need at least one crop, got {num_crops}")
    return [0.5] if num_crops == 1 else np.linspace(0.0, 1.0, num_crops).tolist()


def crop_box(
    height: int, width: int, short_side: float, crop_size: int, fy: float, fx: float
) -> tuple[int, int, int]:
    """(top, left, side) of the square input region that becomes the crop once the short side is short_side.

    fy, fx in [0, 1] place the region between the top/left (0) and bottom/right (1) edges.
    """
    side = min(round(crop_size * min(height, width) / short_side), height, width)
    return round((height - side) * fy), round((width - side) * fx), side


def normalize(
    frames: torch.Tensor, mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD
) -> torch.Tensor:
    """uint8 [T, C, H, W] -> float32 [C, T, H, W] normalised by per-channel ``mean``/``std`` (of [0, 1] values),
    in one fused multiply-subtract, on the frames' device."""
    mean = torch.tensor(mean, dtype=torch.float32, device=frames.device).view(-1, 1, 1, 1)
    std = torch.tensor(std, dtype=torch.float32, device=frames.device).view(-1, 1, 1, 1)
    video = frames.permute(1, 0, 2, 3).to(torch.float32)
    return video.mul_(1.0 / (255.0 * std)).sub_(mean / std).contiguous()


Frames = torch.Tensor | np.ndarray


def _resized_crop(frames: Frames, crop_size: int, short_side: float, fy: float, fx: float) -> torch.Tensor:
    video = torch.as_tensor(frames).permute(0, 3, 1, 2)  # [T, C, H, W] view, no copy
    top, left, side = crop_box(video.shape[-2], video.shape[-1], short_side, crop_size, fy, fx)
    return TF.resized_crop(video, top, left, side, side, [crop_size, crop_size], antialias=True)


def train_transform(
    frames: Frames,
    crop_size: int,
    short_side: int,
    scale_jitter: tuple[float, float],
    flip: bool,
    rng: np.random.Generator,
    mean: Sequence[float] = IMAGENET_MEAN,
    std: Sequence[float] = IMAGENET_STD,
) -> torch.Tensor:
    """Short side resized to short_side * U(scale_jitter), random crop, optional h-flip, normalise."""
    jittered = short_side * rng.uniform(*scale_jitter)
    fy, fx = rng.random(2)
    # A short side below the crop would need padding; clamp it so the crop always fits.
    video = _resized_crop(frames, crop_size, max(jittered, crop_size), fy, fx)
    if flip and rng.random() < 0.5:
        video = TF.horizontal_flip(video)
    return normalize(video, mean, std)


def eval_transform(
    frames: Frames,
    crop_size: int,
    short_side: int,
    position: float = 0.5,
    mean: Sequence[float] = IMAGENET_MEAN,
    std: Sequence[float] = IMAGENET_STD,
) -> torch.Tensor:
    """Short side resized to short_side, then a crop_size square at `position` along the long side."""
    height, width = frames.shape[1:3]
    fy, fx = (0.5, position) if width >= height else (position, 0.5)
    return normalize(_resized_crop(frames, crop_size, short_side, fy, fx), mean, std)
