"""SlowFast ResNet (Feichtenhofer et al., ICCV 2019) as in PySlowFast / GluonCV.

One clip ``[B, 3, T, H, W]`` feeds both pathways: the Fast pathway sees all T frames with 1/beta of the
channels; the Slow pathway sees every alpha-th frame. After the stem and res2-res4 a time-strided
``k x 1 x 1`` conv (stride alpha) fuses Fast into Slow by channel concatenation.

Published configs (PySlowFast ``SLOWFAST_4x16_R50`` / ``SLOWFAST_8x8_R50``, GluonCV
``slowfast_{4x16,8x8}_resnet50_kinetics400``): beta_inv 8, fusion channel ratio 2, fusion kernel 5 (4x16,
alpha 8) or 7 (8x8, alpha 4); temporal kernels Slow 1/1/1/3/3 and Fast 5/3/3/3/3 for conv1/res2..res5.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
from torch import nn

from .blocks import ClassifierHead, ResStage, Stem, init_weights
from .registry import register_model


@dataclass(frozen=True)
class SlowFastSpec:
    alpha: int  # frame-rate ratio Fast:Slow
    fusion_kernel: int
    beta_inv: int = 8  # Fast pathway has 1/beta_inv of the Slow channels
    fusion_ratio: int = 2  # lateral conv output = fusion_ratio x Fast channels
    depths: Sequence[int] = (3, 4, 6, 3)
    width: int = 64
    slow_temporal_kernels: tuple[int, ...] = (1, 1, 1, 3, 3)  # stem, res2..res5
    fast_temporal_kernels: tuple[int, ...] = (5, 3, 3, 3, 3)
    spatial_strides: tuple[int, ...] = (1, 2, 2, 2)  # res2..res5
    dropout: float = 0.5


SLOWFAST_4X16_R50 = SlowFastSpec(alpha=8, fusion_kernel=5)
SLOWFAST_8X8_R50 = SlowFastSpec(alpha=4, fusion_kernel=7)


class FastToSlowFusion(nn.Module):
    """Lateral connection: time-strided conv + BN + ReLU on Fast, concatenated onto Slow."""

    def __init__(self, fast_channels: int, ratio: int, kernel: int, alpha: int) -> None:
        super().__init__()
        self.conv = nn.Conv3d(
            fast_channels,
            fast_channels * ratio,
            kernel_size=(kernel, 1, 1),
            stride=(alpha, 1, 1),
            padding=(kernel // 2, 0, 0),
            bias=False,
        )
        self.bn = nn.BatchNorm3d(fast_channels * ratio)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, slow: torch.Tensor, fast: torch.Tensor) -> torch.Tensor:
        return torch.cat([slow, self.relu(self.bn(self.conv(fast)))], dim=1)


class SlowFast(nn.Module):
    """Two-pathway ResNet: ``[B, 3, T, H, W]`` -> ``[B, num_classes]`` (Slow input = frames ``::alpha``)."""

    def __init__(self, spec: SlowFastSpec, num_classes: int) -> None:
        super().__init__()
        self.alpha = spec.alpha
        fast_width = spec.width // spec.beta_inv
        self.slow_stem = Stem(3, spec.width, temporal_kernel=spec.slow_temporal_kernels[0])
        self.fast_stem = Stem(3, fast_width, temporal_kernel=spec.fast_temporal_kernels[0])

        slow_stages: list[nn.Module] = []
        fast_stages: list[nn.Module] = []
        fusions: list[nn.Module] = []
        slow_out, fast_out = spec.width, fast_width
        for i, depth in enumerate(spec.depths):
            # Fusion after the stem and after every stage but the last feeds the next Slow stage.
            fusions.append(FastToSlowFusion(fast_out, spec.fusion_ratio, spec.fusion_kernel, spec.alpha))
            slow_in = slow_out + fast_out * spec.fusion_ratio
            inner = spec.width * 2**i
            stride = spec.spatial_strides[i]
            slow_stages.append(
                ResStage(slow_in, inner, inner * 4, [spec.slow_temporal_kernels[i + 1]] * depth, stride)
            )
            fast_stages.append(
                ResStage(
                    fast_out,
                    inner // spec.beta_inv,
                    inner * 4 // spec.beta_inv,
                    [spec.fast_temporal_kernels[i + 1]] * depth,
                    stride,
                )
            )
            slow_out, fast_out = inner * 4, inner * 4 // spec.beta_inv
        self.slow_stages = nn.ModuleList(slow_stages)
        self.fast_stages = nn.ModuleList(fast_stages)
        self.fusions = nn.ModuleList(fusions)
        self.head = ClassifierHead(slow_out + fast_out, num_classes, spec.dropout)
        init_weights(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        slow = self.slow_stem(x[:, :, :: self.alpha])
        fast = self.fast_stem(x)
        for fusion, slow_stage, fast_stage in zip(
            self.fusions, self.slow_stages, self.fast_stages, strict=True
        ):
            slow = slow_stage(fusion(slow, fast))
            fast = fast_stage(fast)
        features = torch.cat([self.head.features(slow), self.head.features(fast)], dim=1)
        return self.head.classify(features)


@register_model(
    "slowfast_4x16_resnet50",
    "slowfast_4x16_resnet50_kinetics400",
    "slowfast_4x16_resnet50_custom",
    "slowfast_4x16_r50",  # PySlowFast's config name
)
def slowfast_4x16_resnet50(num_classes: int, dropout: float = 0.5) -> nn.Module:
    """SlowFast R50 4x16: 32-frame clip (stride 2), Slow pathway 4 frames."""
    return SlowFast(replace(SLOWFAST_4X16_R50, dropout=dropout), num_classes)


@register_model(
    "slowfast_8x8_resnet50",
    "slowfast_8x8_resnet50_kinetics400",
    "slowfast_8x8_r50",  # PySlowFast's config name
    "slowfast_r50",  # pytorchvideo's hub name
)
def slowfast_8x8_resnet50(num_classes: int, dropout: float = 0.5) -> nn.Module:
    """SlowFast R50 8x8: 32-frame clip (stride 2), Slow pathway 8 frames."""
    return SlowFast(replace(SLOWFAST_8X8_R50, dropout=dropout), num_classes)


@register_model("slowfast_tiny")
def slowfast_tiny(num_classes: int, dropout: float = 0.5) -> nn.Module:
    """SlowFast layout (alpha 4, beta_inv 2) at width 4, one block per stage: for CPU tests."""
    spec = replace(
        SLOWFAST_8X8_R50,
        beta_inv=2,
        depths=(1, 1, 1, 1),
        width=4,
        fusion_kernel=5,
        spatial_strides=(1, 1, 1, 2),  # see resnet3d.TINY
        dropout=dropout,
    )
    return SlowFast(spec, num_classes)
