"""R(2+1)D ResNets (Tran et al., CVPR 2018) as in GluonCV ``r2plus1d_v1_resnet{18,34,50}_kinetics400``.

Every 3x3x3 conv is factorised into a ``1 x 3 x 3`` spatial conv, BN, ReLU and a ``3 x 1 x 1`` temporal conv,
with the middle width chosen so the pair has about the parameters of the full 3D conv. Stages 2-4 downsample
time and space by 2. One builder owns depths and widths for 18/34/50 layers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from .blocks import ClassifierHead, Shortcut, init_weights
from .registry import register_model


def mid_channels(in_channels: int, out_channels: int) -> int:
    """Width between the spatial and temporal convs that matches a full 3x3x3 conv's parameter count."""
    return (in_channels * out_channels * 27) // (in_channels * 9 + 3 * out_channels)


class Conv2Plus1d(nn.Sequential):
    def __init__(self, in_channels: int, out_channels: int, mid: int, stride: int = 1) -> None:
        super().__init__(
            nn.Conv3d(in_channels, mid, (1, 3, 3), stride=(1, stride, stride), padding=(0, 1, 1), bias=False),
            nn.BatchNorm3d(mid),
            nn.ReLU(inplace=True),
            nn.Conv3d(mid, out_channels, (3, 1, 1), stride=(stride, 1, 1), padding=(1, 0, 0), bias=False),
        )


class BasicBlock2Plus1d(nn.Module):
    expansion = 1

    def __init__(self, in_channels: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        mid = mid_channels(in_channels, planes)
        self.conv_a = Conv2Plus1d(in_channels, planes, mid, stride)
        self.bn_a = nn.BatchNorm3d(planes)
        self.conv_b = Conv2Plus1d(planes, planes, mid)
        self.bn_b = nn.BatchNorm3d(planes)
        self.bn_b.is_final_bn = True
        self.relu = nn.ReLU(inplace=True)
        self.shortcut = _shortcut(in_channels, planes, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn_a(self.conv_a(x)))
        out = self.bn_b(self.conv_b(out))
        return self.relu(out + self.shortcut(x))


class Bottleneck2Plus1d(nn.Module):
    expansion = 4

    def __init__(self, in_channels: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        out_channels = planes * self.expansion
        self.conv_a = nn.Conv3d(in_channels, planes, kernel_size=1, bias=False)
        self.bn_a = nn.BatchNorm3d(planes)
        self.conv_b = Conv2Plus1d(planes, planes, mid_channels(in_channels, planes), stride)
        self.bn_b = nn.BatchNorm3d(planes)
        self.conv_c = nn.Conv3d(planes, out_channels, kernel_size=1, bias=False)
        self.bn_c = nn.BatchNorm3d(out_channels)
        self.bn_c.is_final_bn = True
        self.relu = nn.ReLU(inplace=True)
        self.shortcut = _shortcut(in_channels, out_channels, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn_a(self.conv_a(x)))
        out = self.relu(self.bn_b(self.conv_b(out)))
        out = self.bn_c(self.conv_c(out))
        return self.relu(out + self.shortcut(x))


def _shortcut(in_channels: int, out_channels: int, stride: int) -> nn.Module:
    if stride == 1 and in_channels == out_channels:
        return nn.Identity()
    return Shortcut(in_channels, out_channels, (stride, stride, stride))


@dataclass(frozen=True)
class R2Plus1dSpec:
    block: type[BasicBlock2Plus1d] | type[Bottleneck2Plus1d]
    depths: Sequence[int]
    width: int = 64
    dropout: float = 0.5


DEPTHS: dict[int, R2Plus1dSpec] = {
    18: R2Plus1dSpec(BasicBlock2Plus1d, (2, 2, 2, 2)),
    34: R2Plus1dSpec(BasicBlock2Plus1d, (3, 4, 6, 3)),
    50: R2Plus1dSpec(Bottleneck2Plus1d, (3, 4, 6, 3)),
}


class R2Plus1d(nn.Module):
    """``[B, 3, T, H, W]`` -> ``[B, num_classes]``; stem is a factorised ``3 x 7 x 7`` conv (45 mid channels
    at width 64), no max-pool."""

    def __init__(self, spec: R2Plus1dSpec, num_classes: int) -> None:
        super().__init__()
        stem_mid = spec.width * 45 // 64
        self.stem = nn.Sequential(
            nn.Conv3d(3, stem_mid, (1, 7, 7), stride=(1, 2, 2), padding=(0, 3, 3), bias=False),
            nn.BatchNorm3d(stem_mid),
            nn.ReLU(inplace=True),
            nn.Conv3d(stem_mid, spec.width, (3, 1, 1), padding=(1, 0, 0), bias=False),
            nn.BatchNorm3d(spec.width),
            nn.ReLU(inplace=True),
        )
        stages: list[nn.Module] = []
        in_channels = spec.width
        for i, depth in enumerate(spec.depths):
            planes = spec.width * 2**i
            blocks = []
            for j in range(depth):
                blocks.append(spec.block(in_channels, planes, stride=2 if i > 0 and j == 0 else 1))
                in_channels = planes * spec.block.expansion
            stages.append(nn.Sequential(*blocks))
        self.stages = nn.Sequential(*stages)
        self.head = ClassifierHead(in_channels, num_classes, spec.dropout)
        init_weights(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.stages(self.stem(x)))


def r2plus1d(depth: int, num_classes: int, width: int = 64, dropout: float = 0.5) -> R2Plus1d:
    """The one builder: ``depth`` in 18/34/50 picks the block type and stage depths."""
    if depth not in DEPTHS:
        raise ValueError(f"R(2+1)D depth must be one of {sorted(DEPTHS)}, got {depth}")
    base = DEPTHS[depth]
    return R2Plus1d(R2Plus1dSpec(base.block, base.depths, width, dropout), num_classes)


@register_model("r2plus1d_resnet18", "r2plus1d_v1_resnet18_kinetics400")
def r2plus1d_resnet18(num_classes: int, dropout: float = 0.5) -> nn.Module:
    return r2plus1d(18, num_classes, dropout=dropout)


@register_model("r2plus1d_resnet34", "r2plus1d_v1_resnet34_kinetics400")
def r2plus1d_resnet34(num_classes: int, dropout: float = 0.5) -> nn.Module:
    return r2plus1d(34, num_classes, dropout=dropout)


@register_model("r2plus1d_resnet50", "r2plus1d_v1_resnet50_kinetics400", "r2plus1d_v1_resnet50_custom")
def r2plus1d_resnet50(num_classes: int, dropout: float = 0.5) -> nn.Module:
    return r2plus1d(50, num_classes, dropout=dropout)


@register_model("r2plus1d_tiny")
def r2plus1d_tiny(num_classes: int, dropout: float = 0.5) -> nn.Module:
    """R(2+1)D basic-block layout at width 4, one block per stage: for CPU tests."""
    return R2Plus1d(R2Plus1dSpec(BasicBlock2Plus1d, (1, 1, 1, 1), width=4, dropout=dropout), num_classes)
