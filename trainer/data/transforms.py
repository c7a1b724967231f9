"""Clip transforms: decoded uint8 frames [T, H, W, C] in (tensor, on the decoder's device, or numpy array), a uint8
crop out; the crop is normalised where the model runs (`ClipNormalizer`).

Every spatial transform is one `resized_crop` on uint8: we pick the input region that would become the crop after a
short-side resize and resize only that region, which gives the same picture as resize-then-crop at a fraction of the
cost. A region already the crop's size is only sliced (validation and test crops of pre-resized videos).

Resizing is bilinear with antialiasing. Both references resize bilinear without it; the two are identical whenever
the region is enlarged (always, for Kinetics resized to a 256 px short side: training crops 179-224 px regions up
to 224 px), and torch's uint8 kernel runs either at the same speed. They differ only when a region is shrunk (videos
larger than SHORT_SIDE_SIZE kept at their size): antialiasing then averages the pixels a sample covers instead of
aliasing (python -m bench measures both ways on a 2x shrink: time and error against an area-averaged reference).

Clips leave the DataLoader workers as uint8 [C, T, H, W] views of [T, H, W, C] storage (4x less to copy between
processes and to the device than float32); a batch is uint8 [B, C, T, H, W] in channels_last_3d memory order.
`ClipNormalizer` moves it to the device without blocking (from pinned memory), converts and normalises it there
(the clip spec's mean/std, CONFIG.DATA.MEAN/STD) in the model's memory format.
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


class ClipNormalizer:
    """Model input from a batch of clips: uint8 [B, C, T, H, W] (any memory order, CPU or device) -> float32 on
    ``device``, ``(x / 255 - mean) / std`` per channel, in ``memory_format``. The copy to the device does not block
    (the loader pins its batches); conversion and normalisation then run on the device, in one pass over the clip
    where the memory orders already agree. A float clip is taken as normalised already and only moved."""

    def __init__(
        self, mean: Sequence[float], std: Sequence[float], device: torch.device | str = "cpu",
        memory_format: torch.memory_format = torch.contiguous_format,
    ) -> None:
        self.device = torch.device(device)
        self.memory_format = memory_format
        std_t = torch.tensor(std, dtype=torch.float32)
        # (x * scale - shift) == (x / 255 - mean) / std, as the float transforms always computed it
        self.scale = (1.0 / (255.0 * std_t)).view(-1, 1, 1, 1).to(self.device)
        self.shift = (torch.tensor(mean, dtype=torch.float32) / std_t).view(-1, 1, 1, 1).to(self.device)

    def __call__(self, video: torch.Tensor) -> torch.Tensor:
        video = video.to(self.device, non_blocking=True)
        if video.dtype != torch.uint8:
            return video.contiguous(memory_format=self.memory_format)
        out = torch.empty(video.shape, dtype=torch.float32, device=self.device, memory_format=self.memory_format)
        out.copy_(video)  # dtype and memory order in one pass
        return out.mul_(self.scale).sub_(self.shift)


def normalize(
    frames: torch.Tensor, mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD
) -> torch.Tensor:
    """uint8 [C, T, H, W] -> float32 [C, T, H, W] normalised by per-channel ``mean``/``std`` (of [0, 1] values)."""
    return ClipNormalizer(mean, std, frames.device)(frames[None])[0]


Frames = torch.Tensor | np.ndarray


def _resized_crop(frames: Frames, crop_size: int, short_side: float, fy: float, fx: float) -> torch.Tensor:
    """uint8 [T, C, H, W] (a view of [T, H, W, C] storage: torch's fast uint8 resize wants that order)."""
    video = torch.as_tensor(frames).permute(0, 3, 1, 2)  # [T, C, H, W] view, no copy
    top, left, side = crop_box(video.shape[-2], video.shape[-1], short_side, crop_size, fy, fx)
    if side == crop_size:  # nothing to resize: a slice (the batch collate copies it once anyway)
        return video[..., top : top + side, left : left + side]
    return TF.resized_crop(video, top, left, side, side, [crop_size, crop_size], antialias=True)


def _as_clip(video: torch.Tensor) -> torch.Tensor:
    """[T, C, H, W] -> the [C, T, H, W] view a clip is."""
    return video.permute(1, 0, 2, 3)


def train_crop(
    frames: Frames,
    crop_size: int,
    short_side: int,
    scale_jitter: tuple[float, float],
    flip: bool,
    rng: np.random.Generator,
) -> torch.Tensor:
    """uint8 [C, T, H, W]: short side resized to short_side * U(scale_jitter), random crop, optional h-flip."""
    jittered = short_side * rng.uniform(*scale_jitter)
    fy, fx = rng.random(2)
    # A short side below the crop would need padding; clamp it so the crop always fits.
    video = _resized_crop(frames, crop_size, max(jittered, crop_size), fy, fx)
    if flip and rng.random() < 0.5:
        video = TF.horizontal_flip(video)
    return _as_clip(video)


def eval_crop(frames: Frames, crop_size: int, short_side: int, position: float = 0.5) -> torch.Tensor:
    """uint8 [C, T, H, W]: short side resized to short_side, then a crop_size square at `position` along the long
    side."""
    height, width = frames.shape[1:3]
    fy, fx = (0.5, position) if width >= height else (position, 0.5)
    return _as_clip(_resized_crop(frames, crop_size, short_side, fy, fx))
