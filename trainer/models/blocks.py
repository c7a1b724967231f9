"""Building blocks shared by the 3D ResNets (I3D, Slow, SlowFast): stem, bottleneck, stage, head, init.

Layouts follow PySlowFast/GluonCV: the temporal kernel sits in the first 1x1 conv of a bottleneck
(``kt x 1 x 1``), the 3x3 conv is purely spatial (``1 x 3 x 3``) and carries the spatial stride.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


class Stem(nn.Module):
    """``kt x 7 x 7`` conv (spatial stride 2) + BN + ReLU + ``1 x 3 x 3`` max-pool (spatial stride 2)."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        temporal_kernel: int,
        temporal_stride: int = 1,
        pool_temporal_stride: int = 1,
    ) -> None:
        super().__init__()
        self.conv = nn.Conv3d(
            in_channels,
            out_channels,
            kernel_size=(temporal_kernel, 7, 7),
            stride=(temporal_stride, 2, 2),
            padding=(temporal_kernel // 2, 3, 3),
            bias=False,
        )
        self.bn = nn.BatchNorm3d(out_channels)
        self.relu = nn.ReLU(inplace=True)
        self.pool = nn.MaxPool3d(
            kernel_size=(1, 3, 3), stride=(pool_temporal_stride, 2, 2), padding=(0, 1, 1)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(self.relu(self.bn(self.conv(x))))


class Shortcut(nn.Sequential):
    """Projection shortcut: ``1 x 1 x 1`` conv with the block's stride + BN."""

    def __init__(self, in_channels: int, out_channels: int, stride: tuple[int, int, int]) -> None:
        super().__init__(
            nn.Conv3d(in_channels, out_channels, kernel_size=1, stride=stride, bias=False),
            nn.BatchNorm3d(out_channels),
        )


class Bottleneck(nn.Module):
    """``kt x 1 x 1`` -> ``1 x 3 x 3`` (strided) -> ``1 x 1 x 1`` residual block."""

    def __init__(
        self,
        in_channels: int,
        inner_channels: int,
        out_channels: int,
        temporal_kernel: int,
        spatial_stride: int = 1,
    ) -> None:
        super().__init__()
        self.conv_a = nn.Conv3d(
            in_channels,
            inner_channels,
            kernel_size=(temporal_kernel, 1, 1),
            padding=(temporal_kernel // 2, 0, 0),
            bias=False,
        )
        self.bn_a = nn.BatchNorm3d(inner_channels)
        self.conv_b = nn.Conv3d(
            inner_channels,
            inner_channels,
            kernel_size=(1, 3, 3),
            stride=(1, spatial_stride, spatial_stride),
            padding=(0, 1, 1),
            bias=False,
        )
        self.bn_b = nn.BatchNorm3d(inner_channels)
        self.conv_c = nn.Conv3d(inner_channels, out_channels, kernel_size=1, bias=False)
        self.bn_c = nn.BatchNorm3d(out_channels)
        self.bn_c.is_final_bn = True  # zero-initialised so the block starts as identity (PySlowFast)
        self.relu = nn.ReLU(inplace=True)
        needs_projection = spatial_stride != 1 or in_channels != out_channels
        self.shortcut = (
            Shortcut(in_channels, out_channels, (1, spatial_stride, spatial_stride))
            if needs_projection
            else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn_a(self.conv_a(x)))
        out = self.relu(self.bn_b(self.conv_b(out)))
        out = self.bn_c(self.conv_c(out))
        return self.relu(out + self.shortcut(x))


class ResStage(nn.Sequential):
    """A stage of bottlenecks; ``temporal_kernels`` gives each block's temporal kernel (1 = not inflated)."""

    def __init__(
        self,
        in_channels: int,
        inner_channels: int,
        out_channels: int,
        temporal_kernels: Sequence[int],
        spatial_stride: int,
    ) -> None:
        blocks = [
            Bottleneck(
                in_channels if i == 0 else out_channels,
                inner_channels,
                out_channels,
                temporal_kernel=kt,
                spatial_stride=spatial_stride if i == 0 else 1,
            )
            for i, kt in enumerate(temporal_kernels)
        ]
        super().__init__(*blocks)


class ClassifierHead(nn.Module):
    """Global spatio-temporal average pool + dropout + linear."""

    def __init__(self, in_features: int, num_classes: int, dropout: float) -> None:
        super().__init__()
        self.pool = nn.AdaptiveAvgPool3d(1)
        self.dropout = nn.Dropout(dropout)
        self.fc = nn.Linear(in_features, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(x).flatten(1)

    def classify(self, features: torch.Tensor) -> torch.Tensor:
        return self.fc(self.dropout(features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classify(self.features(x))


def repeat_pattern(pattern: Sequence[int], length: int) -> list[int]:
    """Cycle ``pattern`` to ``length`` entries: per-block temporal kernels from a short stage pattern."""
    return [pattern[i % len(pattern)] for i in range(length)]


def init_weights(model: nn.Module, head_std: float = 0.01, zero_init_final_bn: bool = True) -> None:
    """PySlowFast initialisation: Kaiming-normal convs (fan_out), BN gamma 1 / beta 0 (gamma 0 for the last
    BN of each residual block), and a normal(0, ``head_std``) linear head with zero bias."""
    for module in model.modules():
        if isinstance(module, nn.Conv3d):
            nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.BatchNorm3d):
            final = zero_init_final_bn and getattr(module, "is_final_bn", False)
            nn.init.constant_(module.weight, 0.0 if final else 1.0)
            nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=head_std)
            nn.init.zeros_(module.bias)
