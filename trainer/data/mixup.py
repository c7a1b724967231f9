"""Mixup and CutMix of a training batch (CONFIG.TRAIN.MIXUP), as timm's ``Mixup`` in its 'batch' mode mixes, which
VideoMAE fine-tunes with: one draw per batch, each clip mixed with its partner in the batch reversed.

- Mixup: clips ``lam * x + (1 - lam) * partner``, ``lam ~ Beta(ALPHA, ALPHA)``.
- CutMix: a box of every frame comes from the partner; its area follows ``1 - lam``, ``lam ~ Beta(CUTMIX_ALPHA,
  CUTMIX_ALPHA)``, and ``lam`` is then the share of the clip left its own (the box clipped at the border: timm's
  ``correct_lam``).
- Both on: CutMix with probability SWITCH_PROB, else Mixup.

The targets are the one-hot labels mixed by the same ``lam``; label smoothing stays with the loss: cross-entropy with
``label_smoothing`` s of these targets is timm's ``mixup_target`` with smoothing s (both ``(1 - s) * mix + s / C``).

Written here, not taken from ``torchvision.transforms.v2.MixUp``/``CutMix``: those draw from torch's global random
state (no generator), so a run resumed mid-epoch could not redraw the mixes the uninterrupted run drew, and they take
a plain 5-D tensor for an unbatched image (a clip batch would have to pass as a ``tv_tensors.Video``, whose (B, T, C,
H, W) layout ours is not). Here every batch's draw is keyed by (TRAIN.SEED, rank, epoch, batch of the epoch).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch.nn import functional as F

from trainer.config import Config


@dataclass(frozen=True)
class Mix:
    """One batch's draw: the weight of each clip's own content and label, and CutMix's box (top, bottom, left,
    right) taken from the partner (None: Mixup)."""

    lam: float
    box: tuple[int, int, int, int] | None = None


class BatchMixer:
    def __init__(self, alpha: float, cutmix_alpha: float, switch_prob: float, num_classes: int, seed: int) -> None:
        self.alpha, self.cutmix_alpha, self.switch_prob = alpha, cutmix_alpha, switch_prob
        self.num_classes, self.seed = num_classes, seed

    @classmethod
    def from_config(cls, cfg: Config) -> BatchMixer | None:
        """The mixer TRAIN.MIXUP asks for, None when both Mixup and CutMix are off."""
        mixup, train = cfg.CONFIG.TRAIN.MIXUP, cfg.CONFIG.TRAIN
        if mixup.ALPHA == 0 and mixup.CUTMIX_ALPHA == 0:
            return None
        return cls(mixup.ALPHA, mixup.CUTMIX_ALPHA, mixup.SWITCH_PROB, cfg.CONFIG.DATA.NUM_CLASSES, train.SEED)

    def draw(self, key: tuple[int, ...], height: int, width: int) -> Mix:
        """The mix of the batch ``key`` (rank, epoch, batch) for frames of ``height`` x ``width``."""
        rng = np.random.default_rng((self.seed, *key))
        use_cutmix = self.cutmix_alpha > 0 and (self.alpha == 0 or rng.random() < self.switch_prob)
        if not use_cutmix:
            return Mix(float(rng.beta(self.alpha, self.alpha)))
        lam = float(rng.beta(self.cutmix_alpha, self.cutmix_alpha))
        # timm's rand_bbox: a box of side ratio sqrt(1 - lam) centred anywhere, clipped at the border
        ratio = np.sqrt(1.0 - lam)
        half_h, half_w = int(height * ratio) // 2, int(width * ratio) // 2
        cy, cx = int(rng.integers(height)), int(rng.integers(width))
        top, bottom = max(cy - half_h, 0), min(cy + half_h, height)
        left, right = max(cx - half_w, 0), min(cx + half_w, width)
        return Mix(1.0 - (bottom - top) * (right - left) / (height * width), (top, bottom, left, right))

    def __call__(
        self, clips: torch.Tensor, labels: torch.Tensor, key: tuple[int, ...]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(mixed clips, soft targets [B, NUM_CLASSES]) of clips (B, C, T, H, W) and their labels."""
        mix = self.draw(key, clips.shape[-2], clips.shape[-1])
        partner = clips.flip(0)
        if mix.box is None:
            mixed = clips * mix.lam + partner * (1.0 - mix.lam)
        else:
            top, bottom, left, right = mix.box
            mixed = clips.clone()
            mixed[..., top:bottom, left:right] = partner[..., top:bottom, left:right]
        one_hot = F.one_hot(labels, self.num_classes).float()
        return mixed, one_hot * mix.lam + one_hot.flip(0) * (1.0 - mix.lam)
