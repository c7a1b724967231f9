"""Top-k classes of one video from a trained checkpoint, averaged over its test views.

    python -m trainer predict VIDEO.mp4 --checkpoint run/checkpoints/best.pth
    python -m trainer predict VIDEO.mp4 --checkpoint best.pth --config-file run/config.yaml   # the config's views

The checkpoint alone is enough: it carries the model name, the class names and the clip settings (sampling, resize,
crop, mean/std, test views) it was trained with. A config, when given, decides the clip settings instead; the class
names still come from the checkpoint, so a config naming a class index that exists only on the cluster works.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from trainer import checkpoint
from trainer.config import Config
from trainer.data.annotations import VideoRecord
from trainer.data.dataset import ClipSpec, VideoClipDataset
from trainer.data.loader import collate_clips
from trainer.data.transforms import ClipNormalizer
from trainer.errors import UserError, reading_checkpoint, report_user_errors
from trainer.models import build_model
from trainer.train import load_cli_config
from trainer.weights import WeightsError, WeightsFile, read_weights


@torch.no_grad()
def predict(model: nn.Module, spec: ClipSpec, video: Path) -> torch.Tensor:
    """Class probabilities of ``video``: the mean softmax over the spec's test views."""
    model.eval()
    views = VideoClipDataset([VideoRecord(str(video), label=0)], "test", spec)
    clips = [views[i] for i in range(len(views))]
    if "bad" in clips[0]:
        raise UserError(f"cannot read {video}: {clips[0]['bad'][1]}")
    batch = collate_clips(clips)
    normalizer = ClipNormalizer(spec.mean, spec.std, next(model.parameters()).device)  # from DECODER_DEVICE's
    return model(normalizer(batch["video"], batch["crops"])).softmax(dim=1).mean(dim=0)


def settings(trained: WeightsFile, cfg: Config | None) -> tuple[str, int, ClipSpec, list[str]]:
    """(model name, classes, clip spec, class names) from the checkpoint, the config's clip settings if given."""
    inference = trained.inference
    if cfg is None:
        if not inference:
            raise WeightsError(f"{trained.path} records no model or clip settings (not a VidCluster checkpoint, or "
                               "saved before they were stored); pass the run's --config-file")
        return inference["model"], inference["num_classes"], checkpoint.clip_spec(inference), inference["class_names"]
    data = cfg.CONFIG.DATA
    names = inference.get("class_names") or checkpoint.class_names(cfg)
    spec = ClipSpec.from_config(cfg)
    if not data.MEAN and inference:  # the config leaves normalisation to the weights: the checkpoint's
        recorded = checkpoint.clip_spec(inference)
        spec = dataclasses.replace(spec, mean=recorded.mean, std=recorded.std)
    return cfg.CONFIG.MODEL.NAME, data.NUM_CLASSES, spec, names


def load_trained(path: Path, cfg: Config | None) -> tuple[nn.Module, ClipSpec, list[str]]:
    """The trained model of checkpoint ``path``, its clip spec and class names; a bad checkpoint is a UserError."""
    with reading_checkpoint(f"checkpoint {path}"):
        trained = read_weights(path)
        model_name, num_classes, spec, names = settings(trained, cfg)
        model = build_model(model_name, num_classes=num_classes)
        checkpoint.load_model_weights(model, trained, model_name)
    return model, spec, names


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="top-k classes of one video", add_help=add_help)
    parser.add_argument("video", type=Path, help="video file to classify")
    parser.add_argument("--checkpoint", type=Path, required=True, help="trained checkpoint (.pth)")
    parser.add_argument("--config-file", type=Path, default=None,
                        help="optional: a config whose clip settings (views, crop) replace the checkpoint's")
    parser.add_argument("--topk", type=int, default=5, help="how many classes to print")
    parser.set_defaults(opts=[])  # the run's config as it was trained: no overrides
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = get_args_parser().parse_args(argv)
    cfg = load_cli_config(args) if args.config_file else None
    model, spec, names = report_user_errors(lambda: load_trained(args.checkpoint, cfg))
    probs = report_user_errors(lambda: predict(model, spec, args.video))
    top = probs.topk(min(args.topk, len(probs)))
    print(f"{args.video}:")
    for rank, (p, i) in enumerate(zip(top.values.tolist(), top.indices.tolist(), strict=True), start=1):
        print(f"{rank}. {names[i]} {100 * p:.1f}%")


if __name__ == "__main__":
    main()
