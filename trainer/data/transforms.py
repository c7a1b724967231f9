"""Clip transforms: decoded uint8 frames [T, H, W, C] in (tensor, on the decoder's device, or numpy array), a `Crop`
out: the square region of the frames that becomes the crop (a view), its size and whether it is mirrored.

A region is what becomes the crop after a short-side resize: resizing only that region gives the same picture as
resize-then-crop at a fraction of the cost. A region already the crop's size is not resized (validation and test
crops of pre-resized videos).

Where the crop is made: on a GPU node, on the GPU (`ClipNormalizer`), so a DataLoader worker touches no pixel after
decoding; regions of a batch differ in size (scale jitter) and travel padded to the largest (loader.stack_clips).
On a node that trains on its CPUs, in the worker (`make_crop`), with torch's fast uint8 kernel, as before.

Resizing is bilinear with antialiasing (in float32 on a GPU). Both references resize bilinear without it; the two
are identical whenever the region is enlarged (always, for Kinetics resized to a 256 px short side: training crops
179-224 px regions up to 224 px). They differ only when a region is shrunk (videos larger than SHORT_SIDE_SIZE kept
at their size): antialiasing then averages the pixels a sample covers instead of aliasing (python -m bench measures
both ways on a 3x shrink: time and error against an area-averaged reference).

Clips leave the DataLoader workers as uint8 (4x less to copy between processes and to the device than float32); a
batch is uint8 [B, C, T, S, S] in channels_last_3d memory order. `ClipNormalizer` moves it to the device without
blocking (from pinned memory) and makes the crops there, normalised with the clip spec's mean/std
(CONFIG.DATA.MEAN/STD), in the model's memory format.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch
from torch.nn import functional as F
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


class Crop(NamedTuple):
    """A crop to make: ``region`` (uint8 [C, T, s, s], a view of the decoded frames) resized to size x size,
    mirrored left-right when ``flip``."""

    region: torch.Tensor
    size: int
    flip: bool = False


# Per clip of a batch: (side of its region in the padded batch, crop size, flip).
CropPlan = tuple[int, int, bool]


class ClipNormalizer:
    """Model input from a batch of clips: uint8 [B, C, T, S, S] regions (any memory order, CPU or device) and their
    crop plans -> float32 [B, C, T, size, size] on ``device``, ``(x / 255 - mean) / std`` per channel, in
    ``memory_format``. The copy to the device does not block (the loader pins its batches); cropping, conversion and
    normalisation run on the device. Without plans the clips are taken as crops already. A float clip is taken as
    normalised already and only moved."""

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

    def __call__(self, video: torch.Tensor, plans: Sequence[CropPlan] | None = None) -> torch.Tensor:
        video = video.to(self.device, non_blocking=True)
        if video.dtype != torch.uint8:
            return video.contiguous(memory_format=self.memory_format)
        side = video.shape[-1]
        if plans is None or all(region == size == side and not flip for region, size, flip in plans):
            out = torch.empty(video.shape, dtype=torch.float32, device=self.device, memory_format=self.memory_format)
            out.copy_(video)  # dtype and memory order in one pass
        else:
            size = plans[0][1]
            out = torch.empty((*video.shape[:3], size, size), dtype=torch.float32, device=self.device,
                              memory_format=self.memory_format)
            for crop, padded, (region, _, flip) in zip(out, video, plans, strict=True):
                clip = resize_region(padded[..., :region, :region], size)
                crop.copy_(clip.flip(-1) if flip else clip)
        return out.mul_(self.scale).sub_(self.shift)


def resize_region(region: torch.Tensor, size: int) -> torch.Tensor:
    """[C, T, s, s] -> [C, T, size, size], bilinear with antialiasing (a region of that size: as it is). uint8 on a
    CPU stays uint8 (torch's fast uint8 kernel, which wants the [T, H, W, C] storage regions have); anything else is
    resized in float32 (on a GPU)."""
    if region.shape[-1] == size:
        return region
    frames = region.transpose(0, 1)  # [T, C, s, s]: frames as images
    if frames.dtype == torch.uint8 and frames.device.type == "cpu":
        return TF.resize(frames, [size, size], antialias=True).transpose(0, 1)
    resized = F.interpolate(frames.to(torch.float32), size=(size, size), mode="bilinear", antialias=True,
                            align_corners=False)
    return resized.transpose(0, 1)


def make_crop(crop: Crop) -> Crop:
    """The crop made where it is (a DataLoader worker of a node that trains on its CPUs), as uint8."""
    clip = resize_region(crop.region, crop.size)
    return Crop(clip.flip(-1) if crop.flip else clip, crop.size)


def normalize(crop: Crop, mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD) -> torch.Tensor:
    """The float32 [C, T, size, size] crop normalised by per-channel ``mean``/``std`` (of [0, 1] values)."""
    plan = (crop.region.shape[-1], crop.size, crop.flip)
    return ClipNormalizer(mean, std, crop.region.device)(crop.region[None], [plan])[0]


Frames = torch.Tensor | np.ndarray


def _region(frames: Frames, crop_size: int, short_side: float, fy: float, fx: float) -> torch.Tensor:
    """uint8 [C, T, s, s] view of the square region that becomes the crop."""
    video = torch.as_tensor(frames).permute(3, 0, 1, 2)  # [C, T, H, W] view, no copy
    top, left, side = crop_box(video.shape[-2], video.shape[-1], short_side, crop_size, fy, fx)
    return video[..., top : top + side, left : left + side]


def train_crop(
    frames: Frames,
    crop_size: int,
    short_side: int,
    scale_jitter: tuple[float, float],
    flip: bool,
    rng: np.random.Generator,
) -> Crop:
    """Short side resized to short_side * U(scale_jitter), random crop, optional h-flip."""
    jittered = short_side * rng.uniform(*scale_jitter)
    fy, fx = rng.random(2)
    # A short side below the crop would need padding; clamp it so the crop always fits.
    region = _region(frames, crop_size, max(jittered, crop_size), fy, fx)
    return Crop(region, crop_size, bool(flip and rng.random() < 0.5))


def eval_crop(frames: Frames, crop_size: int, short_side: int, position: float = 0.5) -> Crop:
    """Short side resized to short_side, then a crop_size square at `position` along the long side."""
    height, width = frames.shape[1:3]
    fy, fx = (0.5, position) if width >= height else (position, 0.5)
    return Crop(_region(frames, crop_size, short_side, fy, fx), crop_size)
