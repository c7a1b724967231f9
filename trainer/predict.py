"""Top-k classes of one video from a trained checkpoint, averaged over the config's test views.

    python -m trainer predict VIDEO.mp4 --config-file run/config.yaml --checkpoint run/checkpoints/best.pth
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import torch

from trainer.checkpoint import load_model_weights
from trainer.config import Config
from trainer.data.annotations import VideoRecord, read_class_index
from trainer.data.dataset import ClipSpec, VideoClipDataset
from trainer.models import build_model
from trainer.train import load_cli_config


@torch.no_grad()
def predict(cfg: Config, video: Path, ckpt: Path) -> torch.Tensor:
    """Class probabilities of ``video``: the mean softmax over TEST_NUM_SEGMENT x TEST_NUM_CROP views."""
    data = cfg.CONFIG.DATA
    model = build_model(cfg.CONFIG.MODEL.NAME, num_classes=data.NUM_CLASSES)
    load_model_weights(model, ckpt)
    model.eval()
    views = VideoClipDataset([VideoRecord(str(video), label=0)], "test", ClipSpec.from_config(cfg))
    clips = [views[i] for i in range(len(views))]
    if "bad" in clips[0]:
        raise SystemExit(f"error: cannot read {video}: {clips[0]['bad'][1]}")
    return model(torch.stack([clip["video"] for clip in clips])).softmax(dim=1).mean(dim=0)


def class_names(cfg: Config) -> list[str]:
    index = cfg.CONFIG.DATA.CLASS_INDEX
    return read_class_index(index) if index else [str(i) for i in range(cfg.CONFIG.DATA.NUM_CLASSES)]


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="top-k classes of one video", add_help=add_help)
    parser.add_argument("video", type=Path, help="video file to classify")
    parser.add_argument("--config-file", type=Path, required=True, help="the run's config.yaml (model, views)")
    parser.add_argument("--checkpoint", type=Path, required=True, help="trained checkpoint (.pth)")
    parser.add_argument("--topk", type=int, default=5, help="how many classes to print")
    parser.set_defaults(opts=[])  # the run's config as it was trained: no overrides
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = get_args_parser().parse_args(argv)
    cfg = load_cli_config(args)
    probs = predict(cfg, args.video, args.checkpoint)
    names = class_names(cfg)
    top = probs.topk(min(args.topk, len(probs)))
    print(f"{args.video}:")
    for rank, (p, i) in enumerate(zip(top.values.tolist(), top.indices.tolist(), strict=True), start=1):
        print(f"{rank}. {names[i]} {100 * p:.1f}%")


if __name__ == "__main__":
    main()
