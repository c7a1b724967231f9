"""Train a video classifier with DistributedDataParallel from a GluonCV-style YAML config.

One node (spawns one worker per GPU, or DDP_CONFIG.CPU_WORKERS gloo workers on a CPU node):
    python -m trainer.train --config-file configs/slowfast.yaml

N nodes, as in the GluonCV tutorial: the same command on every node, each with its own WORLD_RANK (or
AUTO_RANK_MATCH, which finds it from the node's addresses in WOLRD_URLS); launch-training.yml does this for you:
    python -m trainer.train --config-file node.yaml

Under torchrun (one process per GPU, ranks from the environment):
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29400 \
        -m trainer.train --config-file configs/slowfast.yaml

Overrides come last as KEY VALUE pairs: ``CONFIG.TRAIN.BATCH_SIZE 16 CONFIG.TRAIN.EPOCH_NUM 2``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from trainer import checkpoint
from trainer.accel import amp_dtype, configure_backends, prepare_model, wrap_ddp
from trainer.config import Config, ConfigError, dump_config, load_config, run_dir
from trainer.data import build_dataset, build_loader
from trainer.data.loader import epoch_batches, set_loader_epoch
from trainer.data.multigrid import MultigridSchedule
from trainer.distributed import DistContext, add_launcher_args, all_gather_object, broadcast_buffers, launch
from trainer.engine import TrainState, evaluate, gather_bad, train_one_epoch
from trainer.errors import reading_checkpoint, report_user_errors
from trainer.model_setup import apply_training_controls, build_model_from_config
from trainer.precise_bn import update_precise_bn
from trainer.reporting import Reporter, setup_logging
from trainer.solver import build_optimizer, build_scheduler, effective_lr
from trainer.weights import load_weights
from trainer.weights.pretrained import InitialWeights, initial_weights, initialise, resolve_normalisation

log = logging.getLogger("trainer")


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def epoch_seed(cfg: Config, epoch: int, rank: int) -> int:
    """Randomness of an epoch depends only on (SEED, epoch, rank), so a resumed run replays it exactly."""
    return cfg.CONFIG.TRAIN.SEED + 1_000_003 * (epoch + 1) + rank


def weights_digest(model: nn.Module) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


@dataclass
class Run:
    """Everything an epoch needs, built once by ``train_worker``."""

    ctx: DistContext
    cfg: Config
    out: Path
    model: nn.Module  # what trains: the DDP wrapper when distributed
    raw_model: nn.Module  # the unwrapped module: evaluated, saved and loaded
    train_loader: object
    val_loader: object
    precise_bn_loader: object  # the training loader, at the full grid under multigrid (what is evaluated)
    state: TrainState
    reporter: Reporter
    inference: dict[str, object]  # stored in every checkpoint (checkpoint.inference_info)


def build_train_model(cfg: Config, ctx: DistContext) -> nn.Module:
    """Model by name, initial weights (MODEL.PRETRAINED or LOAD), frozen parts, SyncBN; on ``ctx.device``, not yet
    in DDP."""
    model = build_model_from_config(cfg)
    init = initial_weights(cfg)
    if init is not None:
        initialise(model, cfg, init)
    log.info("%s", apply_training_controls(model, cfg))  # after loading: frozen layers keep the loaded values
    if cfg.CONFIG.TRAIN.SYNC_BN and ctx.distributed:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    return prepare_model(model.to(ctx.device), cfg)


def log_startup(cfg: Config, ctx: DistContext, steps_per_epoch: int, lr: float, out: Path) -> None:
    train, data = cfg.CONFIG.TRAIN, cfg.CONFIG.DATA
    global_batch = train.BATCH_SIZE * ctx.world_size * train.ACCUM_STEPS
    log.info("run dir %s", out)
    log.info(
        "world size %d (%d node(s) x %d worker(s), backend %s); batch %d per process -> global batch %d",
        ctx.world_size, ctx.num_nodes, ctx.local_world_size, ctx.backend, train.BATCH_SIZE, global_batch,
    )
    log.info(
        "model %s, %d classes; clip %d frames x %d segment(s) at %d px; %d optimizer steps per epoch; lr %.4g",
        cfg.CONFIG.MODEL.NAME, data.NUM_CLASSES, data.CLIP_LEN, data.NUM_SEGMENT, data.CROP_SIZE,
        steps_per_epoch, lr,
    )


def train_worker(ctx: DistContext, cfg: Config) -> None:
    """Everything one training process does, from datasets to the final checkpoint."""
    out = run_dir(cfg)
    setup_logging(ctx, out / cfg.CONFIG.LOG.LOG_FILENAME, cfg.CONFIG.LOG.LEVEL)
    train = cfg.CONFIG.TRAIN
    seed_everything(train.SEED)
    configure_backends(cfg)
    ckpt_dir = out / cfg.CONFIG.LOG.SAVE_DIR
    if ctx.is_main:
        out.mkdir(parents=True, exist_ok=True)
        dump_config(cfg, out / "config.yaml")

    train_loader = build_loader(build_dataset(cfg, "train"), cfg, "train", ctx)
    val_loader = build_loader(build_dataset(cfg, "val"), cfg, "val", ctx)
    if len(train_loader) == 0:
        raise ConfigError(f"CONFIG.TRAIN.DROP_LAST: each rank has fewer training videos than BATCH_SIZE "
                          f"{train.BATCH_SIZE}, so every batch is dropped; turn DROP_LAST off or lower BATCH_SIZE")
    epoch_steps = [-(-batches // train.ACCUM_STEPS) for batches in epoch_batches(train_loader, train.EPOCH_NUM)]

    model = build_train_model(cfg, ctx)
    with reading_checkpoint(f"CONFIG.TRAIN.RESUME {train.RESUME!r} (checkpoints in {ckpt_dir})"):
        resume = checkpoint.load_resume_state(ctx, train.RESUME, ckpt_dir)
        if resume is not None:
            model.load_state_dict(resume["model"])  # before DDP wraps it: DDP then broadcasts rank 0's weights
    raw_model = model
    model = wrap_ddp(model, ctx, cfg)

    lr = effective_lr(cfg, train.BATCH_SIZE * ctx.world_size * train.ACCUM_STEPS)
    optimizer = build_optimizer(cfg, raw_model, lr)
    fp16 = amp_dtype(ctx.device, train.AMP) == torch.float16  # the gradient scaler is for fp16 autocast only
    state = TrainState(optimizer, build_scheduler(cfg, optimizer, epoch_steps),
                       torch.amp.GradScaler(ctx.device.type, enabled=fp16))
    start_epoch, best_top1 = 0, -1.0
    if resume is not None:
        state.optimizer.load_state_dict(resume["optimizer"])
        state.scheduler.load_state_dict(resume["scheduler"])
        state.scaler.load_state_dict(resume["scaler"])
        start_epoch, best_top1, state.step = resume["epoch"], resume["best_top1"], resume["step"]
        log.info("resumed from %s at epoch %d", resume["path"], start_epoch)

    steps_per_epoch = epoch_steps[min(start_epoch, train.EPOCH_NUM - 1)]
    log_startup(cfg, ctx, steps_per_epoch, lr, out)
    reporter = Reporter(ctx, out, out / cfg.CONFIG.LOG.LOG_DIR, train.EPOCH_NUM)
    reporter.update_status(force=True, state="running", epoch=start_epoch, steps_per_epoch=steps_per_epoch)
    inference = checkpoint.inference_info(cfg, checkpoint.class_names(cfg))
    precise_bn_loader = train_loader
    if train.PRECISE_BN and MultigridSchedule.from_config(cfg) is not None:
        precise_bn_loader = build_loader(train_loader.dataset, cfg, "train", ctx, multigrid=False)
    run = Run(ctx, cfg, out, model, raw_model, train_loader, val_loader, precise_bn_loader, state, reporter, inference)
    try:
        for epoch in range(start_epoch, train.EPOCH_NUM):
            best_top1 = run_epoch(run, epoch, best_top1)
        finish(raw_model, ctx, out, reporter)
    except BaseException as exc:
        reporter.close("failed", f"{type(exc).__name__}: {exc}")
        raise


def run_epoch(run: Run, epoch: int, best_top1: float) -> float:
    """Train one epoch, validate when due, log, checkpoint. Returns the best validation top-1 so far."""
    ctx, cfg, state = run.ctx, run.cfg, run.state
    train, log_cfg = cfg.CONFIG.TRAIN, cfg.CONFIG.LOG
    seed_everything(epoch_seed(cfg, epoch, ctx.rank))
    for loader in (run.train_loader, run.precise_bn_loader):  # the same loader twice without a separate one
        set_loader_epoch(loader, epoch)
    state.bad_videos.clear()
    state.fallback_videos.clear()
    metrics: dict[str, object] = {"lr": state.scheduler.get_last_lr()[0]}
    metrics.update(train_one_epoch(run.model, run.train_loader, state, ctx, cfg, epoch, run.reporter))
    broadcast_buffers(run.raw_model)
    done = epoch + 1
    is_best = False
    bad = gather_bad(state.bad_videos)  # this epoch's training skips, from every rank
    fallback = dict(gather_bad(state.fallback_videos))  # path -> why decord could not open it
    validate = done % cfg.CONFIG.VAL.FREQ == 0 or done == train.EPOCH_NUM
    save = done % log_cfg.SAVE_FREQ == 0 or done == train.EPOCH_NUM
    if train.PRECISE_BN and (validate or save):  # as PySlowFast: before each evaluation and checkpoint
        batches = update_precise_bn(run.raw_model, run.precise_bn_loader, ctx, cfg)
        log.info("precise BatchNorm statistics from %d batches over %d rank(s)", batches, ctx.world_size)
    if validate:
        val = evaluate(run.raw_model, run.val_loader, ctx, cfg)
        metrics.update({f"val_{k}": v for k, v in val.items() if k not in ("bad", "fallback")})
        is_best = val["top1"] > best_top1
        best_top1 = max(best_top1, val["top1"])
        bad = sorted({*bad, *val["bad"]})  # evaluate already gathered its own
        fallback.update(val["fallback"])
    for path, reason in bad:
        log.warning("skipped bad video %s: %s", path, reason)
    for path, reason in sorted(fallback.items()):
        if path not in state.fallback_reported:
            log.info("decoded with torchcodec, as decord cannot open it: %s (%s)", path, reason)
            state.fallback_reported.add(path)
    metrics["bad_videos"] = len(bad)
    metrics["decoder_fallbacks"] = len(fallback)
    log.info("epoch %d/%d %s", done, train.EPOCH_NUM,
             " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in metrics.items()))
    run.reporter.epoch_end(done, metrics)
    if ctx.is_main and (save or is_best):
        ckpt = checkpoint.build_checkpoint(run.raw_model, state, epoch=done, best_top1=best_top1,
                                           config_yaml=(run.out / "config.yaml").read_text(), metrics=metrics,
                                           inference=run.inference)
        path = checkpoint.save_checkpoint(ckpt, run.out / log_cfg.SAVE_DIR, done, is_best, train.KEEP_LAST)
        log.info("saved %s%s", path, " (best)" if is_best else "")
    return best_top1


def finish(raw_model: nn.Module, ctx: DistContext, out: Path, reporter: Reporter) -> None:
    """Check every rank holds the same weights (written by rank 0), then close the run as finished."""
    digests = all_gather_object(weights_digest(raw_model))
    if ctx.is_main:
        identical = len(set(digests)) == 1
        (out / "weights_digest.json").write_text(
            json.dumps({"world_size": ctx.world_size, "digests": digests, "identical": identical}, indent=1)
        )
        log.info("final weights identical on all %d ranks: %s", ctx.world_size, identical)
    reporter.close("finished")


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="DDP video-classification training", add_help=add_help)
    parser.add_argument("--config-file", type=Path, required=True, help="experiment YAML (GluonCV DDP format)")
    parser.add_argument("opts", nargs=argparse.REMAINDER, default=[], help="KEY VALUE overrides")
    add_launcher_args(parser)
    return parser


def load_cli_config(args: argparse.Namespace) -> Config:
    return report_user_errors(lambda: load_config(args.config_file, args.opts))


def prepare_initial_weights(cfg: Config) -> None:
    """Before any worker starts: find and verify the initial weights, check that they fit the model (one-line
    error and exit status 2 if not), and fill DATA.MEAN/STD left empty with what they expect."""

    def checked() -> InitialWeights | None:
        init = initial_weights(cfg)
        if init is not None:
            load_weights(build_model_from_config(cfg), init.path, allow_partial=cfg.CONFIG.MODEL.PARTIAL_LOAD,
                         model_name=cfg.CONFIG.MODEL.NAME)
        return init

    resolve_normalisation(cfg, report_user_errors(checked))


def setup_launcher_logging() -> None:
    """The launching process reports where it rendezvouses and on which interfaces (workers log on their own)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S")


def main(argv: Sequence[str] | None = None) -> None:
    args = get_args_parser().parse_args(argv)
    setup_launcher_logging()
    cfg = load_cli_config(args)
    prepare_initial_weights(cfg)
    report_user_errors(lambda: launch(train_worker, cfg, local_rank=args.local_rank))


if __name__ == "__main__":
    main()
