"""ResNet-3D family from one builder: I3D ResNet-50 (GluonCV ``i3d_resnet50_v1``) and Slow-only ResNet-50
(GluonCV ``i3d_slow_resnet50_*``, PySlowFast ``SLOW_8x8_R50``, pytorchvideo ``slow_r50``), PySlowFast's I3D
(``I3D_8x8_R50``, pytorchvideo ``i3d_r50``), plus tiny CPU variants.

The variants differ only in their :class:`ResNet3dSpec`: stem temporal kernel and strides, per-stage temporal
kernel patterns, and I3D's extra temporal max-pool after res2.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
from torch import nn

from .blocks import ClassifierHead, ResStage, Stem, init_weights, repeat_pattern
from .registry import register_model

RESNET50_DEPTHS = (3, 4, 6, 3)


@dataclass(frozen=True)
class ResNet3dSpec:
    """Everything that distinguishes one 3D ResNet from another."""

    stem_temporal_kernel: int
    # Per stage, a pattern of temporal kernels cycled over the stage's blocks (1 = a 2D block).
    temporal_patterns: tuple[tuple[int, ...], ...]
    depths: Sequence[int] = RESNET50_DEPTHS
    width: int = 64  # stem channels and res2 inner width; doubles each stage, outputs are 4x inner
    stem_temporal_stride: int = 1
    pool1_temporal_stride: int = 1
    pool2: bool = False  # I3D: temporal max-pool (2x1x1) after res2
    spatial_strides: tuple[int, ...] = (1, 2, 2, 2)  # res2..res5
    dropout: float = 0.5


# GluonCV i3d_resnet50_v1: conv1 5x7x7 (temporal stride 2), pool1 and pool2 halve time, inflate_freq
# ((1,1,1), (1,0,1,0), (1,0,1,0,1,0), (0,1,0)) with 3x1x1 inflation.
I3D_R50 = ResNet3dSpec(
    stem_temporal_kernel=5,
    temporal_patterns=((3,), (3, 1), (3, 1), (1, 3, 1)),
    stem_temporal_stride=2,
    pool1_temporal_stride=2,
    pool2=True,
)
# PySlowFast I3D_8x8_R50 (pytorchvideo i3d_r50): the same kernels on 8-frame clips, so conv1 and pool1 keep the
# temporal resolution (stride 1); only the pool after res2 halves time.
I3D_R50_PYSLOWFAST = replace(I3D_R50, stem_temporal_stride=1, pool1_temporal_stride=1)
# Slow-only: no temporal downsampling, temporal kernels only in res4/res5 (PySlowFast "slow" basis).
SLOW_R50 = ResNet3dSpec(stem_temporal_kernel=1, temporal_patterns=((1,), (1,), (3,), (3,)))


class ResNet3d(nn.Module):
    """Single-pathway 3D ResNet: ``[B, 3, T, H, W]`` -> ``[B, num_classes]``."""

    def __init__(self, spec: ResNet3dSpec, num_classes: int) -> None:
        super().__init__()
        self.stem = Stem(
            3,
            spec.width,
            temporal_kernel=spec.stem_temporal_kernel,
            temporal_stride=spec.stem_temporal_stride,
            pool_temporal_stride=spec.pool1_temporal_stride,
        )
        stages: list[nn.Module] = []
        in_channels = spec.width
        for i, (depth, pattern) in enumerate(zip(spec.depths, spec.temporal_patterns, strict=True)):
            inner = spec.width * 2**i
            stages.append(
                ResStage(
                    in_channels,
                    inner,
                    inner * 4,
                    temporal_kernels=repeat_pattern(pattern, depth),
                    spatial_stride=spec.spatial_strides[i],
                )
            )
            if i == 0 and spec.pool2:
                stages.append(nn.MaxPool3d(kernel_size=(2, 1, 1), stride=(2, 1, 1)))
            in_channels = inner * 4
        self.stages = nn.Sequential(*stages)
        self.head = ClassifierHead(in_channels, num_classes, spec.dropout)
        init_weights(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.stages(self.stem(x)))


# Tiny variants keep each layout but use width 4 and one block per stage (a few 10k parameters), and stride
# only in res5: on 32 px clips the full strides leave res5 at 1x1, where BatchNorm over a handful of values per
# channel makes training noise.
TINY = {"depths": (1, 1, 1, 1), "width": 4, "spatial_strides": (1, 1, 1, 2)}


@register_model("i3d_resnet50", "i3d_resnet50_v1_kinetics400", "i3d_resnet50_v1_custom")
def i3d_resnet50(num_classes: int, dropout: float = 0.5) -> nn.Module:
    """I3D ResNet-50 (32x2 clips in GluonCV); time is downsampled 8x before res3."""
    return ResNet3d(replace(I3D_R50, dropout=dropout), num_classes)


@register_model("i3d_resnet50_pyslowfast", "i3d_8x8_r50", "i3d_r50")
def i3d_resnet50_pyslowfast(num_classes: int, dropout: float = 0.5) -> nn.Module:
    """I3D ResNet-50 as PySlowFast (I3D_8x8_R50) and pytorchvideo (i3d_r50) build it: 8 x 8 clips."""
    return ResNet3d(replace(I3D_R50_PYSLOWFAST, dropout=dropout), num_classes)


@register_model(
    "slow_resnet50",
    "slow_8x8_r50",
    "slow_r50",
    "i3d_slow_resnet50_f8s8_kinetics400",
    "i3d_slow_resnet50_f16s4_kinetics400",
    "i3d_slow_resnet50_f32s2_kinetics400",
    "i3d_slow_resnet50_f32s2_custom",
)
def slow_resnet50(num_classes: int, dropout: float = 0.5) -> nn.Module:
    """Slow-only ResNet-50; the f8s8/f16s4/f32s2 names share weights shapes and differ only in sampling."""
    return ResNet3d(replace(SLOW_R50, dropout=dropout), num_classes)


@register_model("i3d_tiny")
def i3d_tiny(num_classes: int, dropout: float = 0.5) -> nn.Module:
    """I3D layout at width 4, one block per stage: for CPU tests (8+ frames)."""
    return ResNet3d(replace(I3D_R50, dropout=dropout, **TINY), num_classes)


@register_model("slow_tiny")
def slow_tiny(num_classes: int, dropout: float = 0.5) -> nn.Module:
    """Slow-only layout at width 4, one block per stage: for CPU tests."""
    return ResNet3d(replace(SLOW_R50, dropout=dropout, **TINY), num_classes)
