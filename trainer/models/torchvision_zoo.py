"""torchvision's video models by name, randomly initialised with a ``num_classes`` head.

Weights are never downloaded here (``weights=None``): nodes may be offline. torchvision's Kinetics weights come from
the cache filled by ``python -m trainer fetch-weights NAME`` (:mod:`trainer.weights`). Input sizes: the ResNets, S3D
and Swin3D take any clip; MViT needs exactly 16 x 224 x 224.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn
from torchvision.models import video

from .registry import register_model

TORCHVISION_VIDEO_MODELS: dict[str, Callable[..., nn.Module]] = {
    "r3d_18": video.r3d_18,
    "mc3_18": video.mc3_18,
    "r2plus1d_18": video.r2plus1d_18,
    "s3d": video.s3d,
    "mvit_v1_b": video.mvit_v1_b,
    "mvit_v2_s": video.mvit_v2_s,
    "swin3d_t": video.swin3d_t,
    "swin3d_s": video.swin3d_s,
    "swin3d_b": video.swin3d_b,
}


def _register(name: str, constructor: Callable[..., nn.Module]) -> None:
    @register_model(name, f"torchvision_{name}")
    def build(num_classes: int, **kwargs: object) -> nn.Module:
        # torchvision builds a fresh head of num_classes outputs when no weights are requested.
        return constructor(weights=None, num_classes=num_classes, **kwargs)

    build.__doc__ = f"torchvision.models.video.{name} (weights=None)."


for _name, _constructor in TORCHVISION_VIDEO_MODELS.items():
    _register(_name, _constructor)
