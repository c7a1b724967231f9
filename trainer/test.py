"""Multi-view test of a trained checkpoint: TEST_NUM_SEGMENT clips x TEST_NUM_CROP crops per video.

    python -m trainer.test --config-file configs/slowfast.yaml [--checkpoint run/checkpoints/best.pth]

Runs on every rank like training (same launcher, same config); the views of each video are merged in memory with
all-reduces, so no shared filesystem is needed. Rank 0 writes ``test_results.json`` into LOG.EVAL_DIR (default:
the run directory).
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
from collections.abc import Sequence
from pathlib import Path

from trainer import checkpoint
from trainer.accel import configure_backends, prepare_model
from trainer.config import Config, run_dir
from trainer.data import build_dataset, build_loader, loader_workers
from trainer.distributed import DistContext, add_launcher_args, launch
from trainer.engine import test_multiview
from trainer.errors import reading_checkpoint, report_user_errors
from trainer.model_setup import build_model_from_config, check_takes_clip
from trainer.reporting import setup_logging
from trainer.train import load_cli_config, setup_launcher_logging
from trainer.weights import read_weights

log = logging.getLogger("trainer")


def test_worker(ctx: DistContext, cfg: Config, ckpt: Path | None) -> dict:
    """One test process: load the checkpoint, score every view of its shard, merge views across ranks."""
    out = run_dir(cfg)
    setup_logging(ctx, out / cfg.CONFIG.LOG.LOG_FILENAME, cfg.CONFIG.LOG.LEVEL)
    data = cfg.CONFIG.DATA
    model = build_model_from_config(cfg)
    check_takes_clip(model, cfg, "TEST_CROP_SIZE")
    with reading_checkpoint(f"checkpoint {ckpt or 'in ' + str(out / cfg.CONFIG.LOG.SAVE_DIR)}"):
        path = ckpt or checkpoint.find_eval_checkpoint(out / cfg.CONFIG.LOG.SAVE_DIR)
        trained = read_weights(path)
        checkpoint.load_model_weights(model, trained, cfg.CONFIG.MODEL.NAME)
    recorded = trained.inference.get("clip")
    if recorded and not data.MEAN:  # normalisation left to the weights: what the model was trained with
        data.MEAN, data.STD = recorded["mean"], recorded["std"]
    configure_backends(cfg)
    prepare_model(model.to(ctx.device), cfg)
    dataset = build_dataset(cfg, "test")
    num_views = data.TEST_NUM_SEGMENT * data.TEST_NUM_CROP
    num_videos = len(dataset) // num_views
    log.info("testing %s on %d videos x %d views (%d x %d)", path, num_videos, num_views,
             data.TEST_NUM_SEGMENT, data.TEST_NUM_CROP)
    with loader_workers():
        result = test_multiview(model, build_loader(dataset, cfg, "test", ctx), ctx, cfg, num_videos,
                                data.NUM_CLASSES)
    summary = {k: result[k] for k in ("top1", "top5", "videos", "views_per_video")}
    summary.update(checkpoint=str(path), bad_videos=[list(b) for b in result["bad"]],
                   decoder_fallbacks=[list(f) for f in result["fallback"]])
    if ctx.is_main:
        eval_dir = Path(cfg.CONFIG.LOG.EVAL_DIR) if cfg.CONFIG.LOG.EVAL_DIR else out
        eval_dir.mkdir(parents=True, exist_ok=True)
        (eval_dir / "test_results.json").write_text(json.dumps(summary, indent=1))
        log.info("test top-1 %.2f%%, top-5 %.2f%% over %d videos", result["top1"], result["top5"], result["videos"])
    return summary


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="multi-view test of a checkpoint", add_help=add_help)
    parser.add_argument("--config-file", type=Path, required=True, help="experiment YAML (GluonCV DDP format)")
    parser.add_argument("--checkpoint", type=Path, default=None,
                        help="checkpoint to test (default: best.pth, else the newest, in the run directory)")
    parser.add_argument("opts", nargs=argparse.REMAINDER, default=[], help="KEY VALUE overrides")
    add_launcher_args(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = get_args_parser().parse_args(argv)
    cfg = load_cli_config(args)
    setup_launcher_logging()
    report_user_errors(lambda: launch(functools.partial(test_worker, ckpt=args.checkpoint), cfg,
                                      local_rank=args.local_rank))


if __name__ == "__main__":
    main()
