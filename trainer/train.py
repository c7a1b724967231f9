"""Train a video classifier with DistributedDataParallel from a GluonCV-style YAML config.

One node (spawns one worker per GPU, or DDP_CONFIG.CPU_WORKERS gloo workers on a CPU node):
    python -m trainer.train --config-file configs/slowfast.yaml

N nodes, as in the GluonCV tutorial: the same command on every node, each with its own WORLD_RANK (or
AUTO_RANK_MATCH, which finds it from the node's addresses in WOLRD_URLS); launch-training.yml does this for you:
    python -m trainer.train --config-file node.yaml

Under torchrun (one process per GPU, ranks from the environment):
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29400 \
        -m trainer.train --config-file configs/slowfast.yaml

Under a plain srun, in your own sbatch script (one task per GPU; ranks from SLURM_PROCID, SLURM_NTASKS and
SLURM_LOCALID, the rendezvous on the step's first node: trainer.distributed):
    srun --nodes 2 --ntasks-per-node 8 python -m trainer.train --config-file configs/slowfast.yaml

Overrides come last as KEY VALUE pairs: ``CONFIG.TRAIN.BATCH_SIZE 16 CONFIG.TRAIN.EPOCH_NUM 2``.

Checkpoints come after every LOG.SAVE_FREQ epochs and, mid-epoch, every CONFIG.TRAIN.CHECKPOINT_MINUTES of training,
taken by every rank at the same optimizer step (trainer.coordination) and written in the background by rank 0 and by
the first process of node 1 (trainer.checkpoint). RESUME auto resumes the newest one that counts, exactly
(trainer.resume). SIGTERM or SIGUSR1 to any training process asks for a stop: every rank saves a checkpoint at the
next optimizer step, and the command ends with status 75.

Exit status (trainer.errors): 0 finished; 2 the input is bad (config, data, weights; also data that becomes unreadable
mid-run), which a restart cannot fix; 75 stopped on SIGTERM or SIGUSR1 with a checkpoint: start it again to resume;
anything else a crash. Spawned workers' statuses are the command's; under torchrun each worker process
ends with these statuses, and torchrun itself with 1 when one of them does not end with 0.
"""

from __future__ import annotations

import argparse
import functools
import gc
import hashlib
import json
import logging
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from trainer.startup import collector_paused

with collector_paused():  # torch and the models load without the collector walking them (trainer.startup)
    from torch import nn

    from trainer import checkpoint, heartbeat
    from trainer.accel import configure_backends, grad_scaler, prepare_model, unwrap_ddp, wrap_ddp
    from trainer.bad_videos import BadVideos
    from trainer.checkpoint import CheckpointWriter
    from trainer.config import Config, ConfigError, config_to_yaml, dump_config, load_config, run_dir
    from trainer.continuation import (
        RECIPE_WORLD_KEY,
        Continuation,
        Kept,
        Memory,
        Position,
        checkpoint_continuation,
        go_on_from_memory,
        log_accumulation,
        recall_buffers,
        restore_buffers,
        run_recipe,
        shared_memory,
    )
    from trainer.coordination import StepControl, StopRequest, stop_signals
    from trainer.data import build_dataset, build_loader, loader_workers
    from trainer.data.check import require_readable
    from trainer.data.loader import end_workers, epoch_batches, set_loader_epoch, skip_batches
    from trainer.data.multigrid import MultigridSchedule
    from trainer.distributed import (
        DistContext,
        PeerError,
        abort_groups,
        add_launcher_args,
        all_gather_object,
        barrier,
        broadcast_buffers,
        broadcast_object,
        launch,
        rejoin,
    )
    from trainer.elastic import Accumulation, Recipe, continuation_seed, epoch_seed
    from trainer.engine import EpochTally, TrainState, evaluate, gather_bad, train_one_epoch
    from trainer.errors import Preempted, first_line, lost_peer, reading_checkpoint, report_user_errors
    from trainer.inplace import InPlace, LeftAttempt, ParentGone, standby_argv
    from trainer.model_setup import apply_training_controls, build_model_from_config
    from trainer.pace import StepClock
    from trainer.precise_bn import update_precise_bn
    from trainer.reporting import Reporter, attempt_from_env, attempt_record, setup_logging
    from trainer.resume import EpochProgress, load_resume_state, seed_everything
    from trainer.runtime.contract import DIGEST_FILE, METRICS_FILE, RUN_CONFIG_FILE
    from trainer.runtime.host.channel import Join
    from trainer.runtime.watch.messages import CHECKPOINT, EVALUATE
    from trainer.sharding import check_resume_kind, full_model_state, is_sharded, require_one_checkpoint_dir, uses_fsdp2
    from trainer.solver import build_optimizer, build_scheduler, effective_lr, schedule_lr
    from trainer.timeline import PROCESS
    from trainer.weights.pretrained import (
        InitialWeights,
        initial_weights,
        initialise,
        load_initial,
        resolve_normalisation,
    )

log = logging.getLogger("trainer")

SAMPLE_LOG_DIR = "samples"  # LOG.SAMPLE_LOG: rank<R>.jsonl in the run directory


def weights_digest(model: nn.Module) -> str:
    """Of the whole model (every rank calls it: a sharded model's state is gathered)."""
    digest = hashlib.sha256()
    for name, tensor in sorted(full_model_state(model).items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


@dataclass
class Run:
    """Everything an epoch needs, built once by ``prepare_run``."""

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
    config_yaml: str  # rank 0's resolved config, stored in every checkpoint
    control: StepControl
    writer: CheckpointWriter | None  # this process writes checkpoints (rank 0; node 1's first process)
    start_epoch: int
    progress: Continuation | None  # where the start epoch stands, when the run goes on mid-epoch
    attempt: dict[str, Any] | None  # rank 0: $VIDCLUSTER_ATTEMPT, recorded after this attempt's first step
    resumed_step: int
    place: InPlace | None  # restart in place: the supervisor's word is read after every step and validation batch
    bad_videos: BadVideos  # the run's bad videos, every rank's (trainer.bad_videos)
    recipe: Recipe
    accumulation: Accumulation  # this attempt's, in its world
    epoch_steps: list[int]  # optimizer steps of each epoch (the recipe's, in any world)
    resumed_from: str  # "memory", the checkpoint file's name, or "" (a fresh start)
    samples: Path | None  # LOG.SAMPLE_LOG: this rank's sample log
    best_top1: float = -1.0
    stepped: bool = False  # this attempt has taken an optimizer step
    position: Position | None = None  # where training stands after the last completed optimizer step


def build_train_model(cfg: Config, ctx: DistContext) -> nn.Module:
    """Model by name, initial weights (MODEL.PRETRAINED or LOAD), frozen parts, SyncBN; on ``ctx.device`` (in CPU
    memory under SHARDING fsdp2), not yet in DDP."""
    model = build_model_from_config(cfg)
    init = initial_weights(cfg)
    if init is not None:
        initialise(model, cfg, init)
    log.info("%s", apply_training_controls(model, cfg))  # after loading: frozen layers keep the loaded values
    if cfg.CONFIG.TRAIN.SYNC_BN and ctx.distributed:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    if uses_fsdp2(cfg) and ctx.distributed:
        # fully_shard moves each unit's parameters to the device as it shards them: the whole model never sits there.
        return prepare_model(model, cfg)
    return prepare_model(model.to(ctx.device), cfg)


def log_startup(cfg: Config, ctx: DistContext, steps_per_epoch: int, lr: float, out: Path, global_batch: int) -> None:
    train, data = cfg.CONFIG.TRAIN, cfg.CONFIG.DATA
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
    """Everything one training process does, from datasets to the final checkpoint; under the runtime with restart
    in place, attempt after attempt in the same process (trainer.inplace)."""
    # First the stop signals: a stop asked for while the run starts is honoured at its first step.
    with stop_signals() as stop, loader_workers():
        place = InPlace.from_env()
        if place is not None:
            place.abort_when_over(abort_groups)  # a collective whose peer is gone fails then, not at its timeout
        kept: Kept | None = None
        join: Join | None = None  # the attempt this process was handed in place
        while True:
            run = None
            try:
                if join is not None:
                    ctx, cfg = rejoin(ctx, cfg, join.rank, join.rendezvous, list(join.world_urls))
                run = prepare_run(ctx, cfg, stop, kept, place)
                for epoch in range(run.start_epoch, cfg.CONFIG.TRAIN.EPOCH_NUM):
                    run_epoch(run, epoch)
                finish(run)
                return
            except Preempted:
                raise  # the status says so already
            except BaseException as exc:
                if place is not None:
                    place.leaving()
                if run is not None:
                    run.reporter.close("failed", f"{type(exc).__name__}: {first_line(exc)}")
                if place is None or stop.requested or not (attempt_ended(exc) or place.over(PROCESS.attempt)):
                    raise
                log.warning("rank %d: attempt %s is over (%s: %s); waiting in place for the next one", ctx.rank,
                            PROCESS.attempt, type(exc).__name__, first_line(exc))
                kept = park(run, kept)
            run = None
            gc.collect()  # the attempt's DDP wrapper, optimizer and groups go now, not whenever (main froze the rest)
            try:
                join = place.next_attempt(PROCESS.attempt, lambda: stop.requested)
            except ParentGone as exc:
                raise PeerError(f"rank {ctx.rank}: {exc}") from None
            log.warning("rank %d: joining attempt %d in place as node rank %d, rendezvous %s", ctx.rank, join.attempt,
                        join.rank, join.rendezvous)


def attempt_ended(exc: BaseException) -> bool:
    """Whether ``exc`` ends this process's attempt rather than being a failure of its own: its peers lost, its group
    not formed (PeerError), or its supervisor's word (LeftAttempt)."""
    return isinstance(exc, LeftAttempt | PeerError) or (isinstance(exc, Exception) and lost_peer(exc))


def park(run: Run | None, kept: Kept | None) -> Kept | None:
    """Out of an attempt that is over: its group torn down; what the next attempt keeps. A checkpoint being written
    goes on being written meanwhile (a thread that the process's exit waits for): whether the next attempt sees it or
    not, every rank chooses the same checkpoint (trainer.resume)."""
    abort_groups()  # its peers may be gone: a graceful teardown would wait for them (nccl)
    if run is None:
        return kept
    unwrap_ddp(run.model)
    memory = Memory.of(run.position, run.state, run.raw_model, run.best_top1, run.bad_videos.items(), run.recipe)
    return Kept(run.ctx.rank, run.ctx.world_size, run.raw_model,
                (run.train_loader, run.val_loader, run.precise_bn_loader), memory)


def prepare_run(ctx: DistContext, cfg: Config, stop: StopRequest, kept: Kept | None = None,
                place: InPlace | None = None) -> Run:
    """Datasets, checkpoint writers, the model and its training state (from memory, when the ranks that hold one hold
    the same step: a rank that holds none receives a peer's; else resumed when there is a checkpoint); ``kept``: what
    this process kept from the attempt before (restart in place)."""
    out = run_dir(cfg)
    setup_logging(ctx, out / cfg.CONFIG.LOG.LOG_FILENAME, cfg.CONFIG.LOG.LEVEL)
    train = cfg.CONFIG.TRAIN
    attempt = attempt_from_env() if ctx.is_main else None
    seed_everything(train.SEED)
    configure_backends(cfg)
    ckpt_dir = out / cfg.CONFIG.LOG.SAVE_DIR
    if ctx.is_main:
        out.mkdir(parents=True, exist_ok=True)
        dump_config(cfg, out / RUN_CONFIG_FILE)
    config_yaml = broadcast_object(config_to_yaml(cfg) if ctx.is_main else None)
    writer = CheckpointWriter(ckpt_dir, train.KEEP_LAST) if checkpoint.writes_checkpoints(ctx, out) else None
    sharded = uses_fsdp2(cfg) and ctx.distributed
    if sharded:
        require_one_checkpoint_dir(ctx, writer is not None, out)

    shared = shared_memory(ctx, kept)
    memory = shared.memory if shared is not None else None
    resume = None
    reading = f"CONFIG.TRAIN.RESUME {train.RESUME!r} (checkpoints in {ckpt_dir})"
    if memory is None:
        if kept is not None:
            kept.memory = None  # the checkpoint goes into its model: what it held is gone
        with reading_checkpoint(reading):
            resume = load_resume_state(ctx, train.RESUME, ckpt_dir, out / METRICS_FILE, writer is not None)
    recipe = run_recipe(cfg, ctx, memory, resume)
    accumulation = recipe.accumulation(ctx.world_size)
    PROCESS.accumulating(accumulation.micro_batches)
    train_loader, val_loader, precise_bn_loader = attempt_loaders(cfg, ctx, kept, recipe)
    epoch_steps = [-(-batches // accumulation.micro_batches)
                   for batches in epoch_batches(train_loader, train.EPOCH_NUM)]

    # A kept model has trained on: without a checkpoint or its memory the run starts again from the initial weights.
    # A sharded one belongs to the attempt's group: it is built again.
    model = (kept.model if kept is not None and (resume is not None or memory is not None) and not sharded
             else build_train_model(cfg, ctx))
    if resume is not None:
        check_resume_kind(resume, cfg)
    if resume is not None and not sharded:
        with reading_checkpoint(reading):
            model.load_state_dict(resume["model"])  # before DDP wraps it: DDP then broadcasts rank 0's weights
    if shared is not None:
        recall_buffers(model, ctx, shared)
    PROCESS.mark("checkpoint")
    raw_model = model
    model = wrap_ddp(model, ctx, cfg, accumulation.micro_batches)  # every rank takes rank 0's parameters and buffers
    if shared is not None and not shared.joiners:  # every rank goes on from its own memory
        restore_buffers(raw_model, ctx, shared.memory.position)

    lr = effective_lr(cfg, recipe.global_batch)
    optimizer = build_optimizer(cfg, raw_model, lr)
    state = TrainState(optimizer, build_scheduler(cfg, optimizer, epoch_steps), grad_scaler(ctx.device, train.AMP))
    start_epoch, best_top1, progress, resumed_from = 0, -1.0, None, ""
    if shared is not None:
        start_epoch, best_top1, progress = go_on_from_memory(ctx, state, shared, epoch_steps, accumulation)
        resumed_from = "memory"
        if ctx.rank in shared.joiners:
            # Said on its own rank (its INFO lines are not logged): a node new to the job is worth a line.
            log.warning("rank %d joined at step %d (epoch %d) from rank %d's memory, no checkpoint read", ctx.rank,
                        state.step, start_epoch + 1, shared.donor)
        else:
            log.info("continued from memory at step %d (epoch %d)", state.step, start_epoch + 1)
    elif resume is not None:
        with reading_checkpoint(reading):
            if sharded:  # each rank its own shards, as this run shards the model
                checkpoint.load_sharded_checkpoint(raw_model, state.optimizer, Path(resume["path"]))
            else:
                state.optimizer.load_state_dict(resume["optimizer"])
        state.scheduler.load_state_dict(resume["scheduler"])
        state.scaler.load_state_dict(resume["scaler"])
        start_epoch, best_top1, state.step = resume["epoch"], resume["best_top1"], resume["step"]
        progress = checkpoint_continuation(resume, ctx, recipe, epoch_steps, accumulation)
        resumed_from = Path(resume["path"]).name
        log.info("resumed from %s at epoch %d, step %d%s", resume["path"], start_epoch, state.step,
                 "" if progress is None else f" (mid-epoch: {progress.batches} batch(es) of epoch "
                                             f"{start_epoch + 1} done)")
    log_accumulation(ctx, recipe, kept, memory)

    state.clock = start_clock(raw_model, ctx, state.step, train.CHECKPOINT_MINUTES)
    steps_per_epoch = epoch_steps[min(start_epoch, train.EPOCH_NUM - 1)]
    log_startup(cfg, ctx, steps_per_epoch, lr, out, recipe.global_batch)
    reporter = Reporter(ctx, out, out / cfg.CONFIG.LOG.LOG_DIR, train.EPOCH_NUM, sum(epoch_steps), writer is not None)
    reporter.update_status(force=True, state="running", epoch=start_epoch, step=state.step,
                           steps_per_epoch=steps_per_epoch)
    inference = checkpoint.inference_info(cfg, checkpoint.class_names(cfg))
    if precise_bn_loader is None:
        precise_bn_loader = train_loader
        if train.PRECISE_BN and MultigridSchedule.from_config(cfg) is not None:
            precise_bn_loader = build_loader(train_loader.dataset, cfg, "train", ctx, multigrid=False, recipe=recipe)
    control = StepControl(ctx, train.CHECKPOINT_MINUTES, stop)
    samples = out / SAMPLE_LOG_DIR / f"rank{ctx.rank}.jsonl" if cfg.CONFIG.LOG.SAMPLE_LOG else None
    run = Run(ctx, cfg, out, model, raw_model, train_loader, val_loader, precise_bn_loader, state, reporter,
              inference, config_yaml, control, writer, start_epoch, progress, attempt, state.step, place, BadVideos(),
              recipe, accumulation, epoch_steps, resumed_from, samples, best_top1)
    record_bad_videos(run, memory.bad_videos if memory is not None else BadVideos.from_checkpoint(resume).items())
    return run


def attempt_loaders(cfg: Config, ctx: DistContext, kept: Kept | None, recipe: Recipe) -> tuple[Any, Any, Any]:
    """The attempt's training, validation and precise-BN loaders (None: built later): the kept ones while this
    process's rank and the world stay; else new ones for its shards."""
    loaders = kept.loaders_for(ctx) if kept is not None else None
    if loaders is None:
        if kept is not None:
            end_workers()  # this rank's shards are another's now: the loaders of the attempt before go
        loaders = (build_loader(build_dataset(cfg, "train"), cfg, "train", ctx, recipe=recipe),
                   build_loader(build_dataset(cfg, "val"), cfg, "val", ctx), None)
    if len(loaders[0]) == 0:  # type: ignore[arg-type]
        train = cfg.CONFIG.TRAIN
        raise ConfigError(f"CONFIG.TRAIN.DROP_LAST: each rank has fewer training videos than BATCH_SIZE "
                          f"{train.BATCH_SIZE}, so every batch is dropped; turn DROP_LAST off or lower BATCH_SIZE")
    return loaders


def start_clock(model: nn.Module, ctx: DistContext, step: int, checkpoint_minutes: float) -> StepClock:
    """This attempt's step clock (trainer.pace) on the model's gradients, in this process's heartbeat from now on."""
    clock = StepClock(ctx.device, start_step=step, checkpoint_every_s=60.0 * checkpoint_minutes)
    clock.attach(model)
    heartbeat.measure(lambda: clock.effort)
    heartbeat.watch_gradients(model)
    return clock


def run_epoch(run: Run, epoch: int) -> None:
    """Train one epoch (or its rest, resumed mid-epoch), validate when due, log, checkpoint."""
    ctx, cfg, state = run.ctx, run.cfg, run.state
    train, log_cfg = cfg.CONFIG.TRAIN, cfg.CONFIG.LOG
    seed_everything(epoch_seed(train.SEED, epoch, ctx.rank))
    for loader in (run.train_loader, run.precise_bn_loader):  # the same loader twice without a separate one
        set_loader_epoch(loader, epoch)
    epoch_lr, tally = schedule_lr(state.optimizer), EpochTally.start(ctx.device)
    if run.progress is not None:  # resumed mid-epoch: this rank's counts and RNG states as they were
        epoch_lr, tally = run.progress.lr, run.progress.start(ctx, cfg, epoch, state.step)
        skip_batches(run.train_loader, run.progress.batches)
        run.progress = None
    run.position = Position.after(ctx, state.step, epoch, epoch_lr, tally, run.raw_model)
    metrics: dict[str, object] = {"lr": epoch_lr}
    metrics.update(train_one_epoch(run.model, run.train_loader, state, ctx, cfg, epoch, run.reporter, tally,
                                   functools.partial(after_step, run, epoch, epoch_lr), run.accumulation))
    heartbeat.at(EVALUATE)  # the epoch's end: no step until the next epoch
    broadcast_buffers(run.raw_model)
    done = epoch + 1
    is_best = False
    # A rank whose pass read none of its videos lost its data (a share unmounted on its node): it stops here with
    # status 2, naming its folder; its peers then lose it in the gather below, and the job's verdict names its node.
    require_readable("CONFIG.DATA.TRAIN_ANNO_PATH", "CONFIG.DATA.TRAIN_DATA_PATH", done, tally.clips, tally.bad)
    bad = gather_bad(tally.bad)  # this epoch's training skips, from every rank
    fallback = dict(gather_bad(tally.fallback))  # path -> why decord could not open it
    validate = done % cfg.CONFIG.VAL.FREQ == 0 or done == train.EPOCH_NUM
    save = done % log_cfg.SAVE_FREQ == 0 or done == train.EPOCH_NUM
    if train.PRECISE_BN and (validate or save):  # as PySlowFast: before each evaluation and checkpoint
        batches = update_precise_bn(run.raw_model, run.precise_bn_loader, ctx, cfg)
        log.info("precise BatchNorm statistics from %d batches over %d rank(s)", batches, ctx.world_size)
    if validate:
        val = evaluate(run.raw_model, run.val_loader, ctx, cfg, each_batch=functools.partial(leave_if_told, run))
        require_readable("CONFIG.DATA.VAL_ANNO_PATH", "CONFIG.DATA.VAL_DATA_PATH", done, val["count"], val["bad"])
        metrics.update({f"val_{k}": v for k, v in val.items() if k not in ("bad", "fallback")})
        is_best = val["top1"] > run.best_top1
        run.best_top1 = max(run.best_top1, val["top1"])
        bad = sorted({*bad, *val["bad"]})  # evaluate already gathered its own
        fallback.update(val["fallback"])
    for path, reason in bad:
        log.warning("skipped bad video %s: %s", path, reason)
    record_bad_videos(run, bad)
    for path, reason in sorted(fallback.items()):
        if path not in state.fallback_reported:
            log.info("decoded with torchcodec, as decord cannot open it: %s (%s)", path, reason)
            state.fallback_reported.add(path)
    metrics["bad_videos"] = len(bad)
    metrics["decoder_fallbacks"] = len(fallback)
    log.info("epoch %d/%d %s", done, train.EPOCH_NUM,
             " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in metrics.items()))
    run.reporter.epoch_end(done, metrics)
    run.position = Position.after(ctx, state.step, done, None, EpochTally.start(ctx.device), run.raw_model)  # written
    if save or is_best:
        with state.clock.stalled():
            submit_checkpoint(run, done, metrics, is_best=is_best)
            run.control.checkpointed()


def record_bad_videos(run: Run, bad: list[tuple[str, str]]) -> None:
    """Every rank: these bad videos (the same on every rank) join the run's record, in bad_videos.json; the datasets
    skip the ones whose decoding ran out of time from now on."""
    run.bad_videos.add(bad)
    for loader in (run.train_loader, run.val_loader):
        loader.dataset.skip_timed_out(bad)  # type: ignore[attr-defined]
    run.reporter.bad_videos(run.bad_videos.record())


def after_step(run: Run, epoch: int, epoch_lr: float, tally: EpochTally, step_clips: int, epoch_end: bool) -> None:
    """What every rank does after an optimizer step: agree on a checkpoint or a stop (one all-reduce), report the
    step, record a restarted attempt after its first step."""
    state = run.state
    # Every rank's randomness from here depends on the run's history alone, so a rank that takes this one's place at
    # this step (a process new to the job, another world) draws what it would have drawn.
    seed_everything(continuation_seed(run.cfg.CONFIG.TRAIN.SEED, epoch, state.step, run.ctx.rank))
    run.position = Position.after(run.ctx, state.step, epoch, epoch_lr, tally, run.raw_model)
    if run.samples is not None:
        log_samples(run.samples, state.step, epoch, run.ctx, tally.step_samples)
    with state.clock.waiting():
        verdict = run.control.agree(step_clips)
    heartbeat.stepped()
    PROCESS.stepped()
    run.reporter.step_done(state.step, verdict.clips, schedule_lr(state.optimizer))
    if not run.stepped:
        run.stepped = True
        PROCESS.mark("first_step")
        record_attempt(run)
    leave_if_told(run)
    if verdict.stop or (verdict.checkpoint and not epoch_end):  # at the epoch's end its own checkpoint comes
        save_mid_epoch(run, epoch, epoch_lr, tally)
    if verdict.stop:
        stop_here(run, epoch)


def leave_if_told(run: Run) -> None:
    """LeftAttempt when the supervisor has said this attempt is over (restart in place: trainer.inplace)."""
    if run.place is not None:
        run.place.check(PROCESS.attempt)


def log_samples(path: Path, step: int, epoch: int, ctx: DistContext, samples: list[int]) -> None:
    """LOG.SAMPLE_LOG: this rank's line for step ``step`` (from 1) of ``epoch``: the dataset indices it trained."""
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"step": step, "epoch": epoch, "attempt": PROCESS.attempt, "rank": ctx.rank, "world": ctx.world_size,
              "samples": samples}
    with path.open("a") as file:
        file.write(json.dumps(record) + "\n")


def record_attempt(run: Run) -> None:
    """Rank 0 records a restarted attempt (VIDCLUSTER_ATTEMPT) once its first step is done; node 1's checkpoint
    writer mirrors the record. Every process takes part in the broadcast, whether or not its node set the variable."""
    record = None
    if run.attempt is not None:
        record = attempt_record(run.attempt, run.resumed_step, time.time(), run.resumed_from)
    record = broadcast_object(record)
    if record is not None:
        run.reporter.attempt(record)


def save_mid_epoch(run: Run, epoch: int, epoch_lr: float, tally: EpochTally) -> None:
    """Every rank: a checkpoint of this very step, with where the epoch stands on every rank (the writers write it)."""
    # Both copies hold rank 0's BatchNorm statistics. Training never reads them, and every rank takes rank 0's at the
    # epoch's end anyway, so the final weights are those of a run without mid-epoch checkpoints.
    heartbeat.at(CHECKPOINT)
    with run.state.clock.stalled():
        broadcast_buffers(run.raw_model)
        progress = EpochProgress.capture(run.ctx, epoch, epoch_lr, tally)
        run.control.checkpointed()
        submit_checkpoint(run, epoch, {}, step=run.state.step, progress=progress.record())


def submit_checkpoint(run: Run, epoch: int, metrics: dict[str, Any], is_best: bool = False, step: int | None = None,
                      progress: dict[str, Any] | None = None) -> None:
    """Every rank: the checkpoint after ``epoch`` epochs (mid-epoch: after ``step``, with ``progress``), handed to
    this process's writer in the background; a sharded model's written by every rank before this returns."""
    if run.writer is None and not is_sharded(run.raw_model):
        return
    ckpt = checkpoint.build_checkpoint(
        run.raw_model, run.state, epoch=epoch, best_top1=run.best_top1, config_yaml=run.config_yaml, metrics=metrics,
        inference=run.inference, bad_videos=run.bad_videos.record(), progress=progress)
    ckpt[RECIPE_WORLD_KEY] = run.recipe.world
    if is_sharded(run.raw_model):
        checkpoint.save_sharded_checkpoint(run.ctx, run.raw_model, run.state.optimizer, ckpt,
                                           run.out / run.cfg.CONFIG.LOG.SAVE_DIR, epoch, is_best,
                                           run.cfg.CONFIG.TRAIN.KEEP_LAST, step)
        log.info("saved %s%s", checkpoint.checkpoint_name(epoch, step, checkpoint.SHARDED_SUFFIX),
                 " (best)" if is_best else "")
    elif run.writer is not None:
        run.writer.submit(ckpt, epoch, is_best, step)


def stop_here(run: Run, epoch: int) -> NoReturn:
    """Every rank, after the stop's checkpoint: wait until every copy is on disk, say so, end as preempted."""
    if run.writer is not None:
        run.writer.wait()
    barrier(run.ctx)
    step = run.state.step
    name = checkpoint.checkpoint_name(epoch, step)
    message = f"stopped on a signal at step {step} (epoch {epoch + 1}) with checkpoint {name}; start again to resume"
    log.warning("%s", message)
    run.reporter.close("preempted", message, step=step)
    raise Preempted(message)


def finish(run: Run) -> None:
    """Wait for the last checkpoint, check every rank holds the same weights (rank 0 writes them); the run finished."""
    if run.writer is not None:
        run.writer.wait()
    digests = all_gather_object(weights_digest(run.raw_model))  # also: every copy is on disk before "finished"
    if run.ctx.is_main:
        identical = len(set(digests)) == 1
        (run.out / DIGEST_FILE).write_text(
            json.dumps({"world_size": run.ctx.world_size, "digests": digests, "identical": identical}, indent=1)
        )
        log.info("final weights identical on all %d ranks: %s", run.ctx.world_size, identical)
        run.bad_videos.report()
    run.reporter.close("finished", bad_videos=len(run.bad_videos.reasons))


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
            load_initial(build_model_from_config(cfg), cfg, init)
        return init

    resolve_normalisation(cfg, report_user_errors(checked))


def setup_launcher_logging() -> None:
    """The launching process reports where it rendezvouses and on which interfaces (workers log on their own)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S")


def main(argv: Sequence[str] | None = None) -> None:
    PROCESS.mark("imported")
    # The imports froze already (trainer.startup); this adds the rest of this module, and whatever a caller imported
    # before main(), so that a full collection (a survivor parking in place: train_worker) walks only what the run
    # made: 0.2 ms here, not 0.2 s.
    gc.freeze()
    args = get_args_parser().parse_args(standby_argv(list(sys.argv[1:] if argv is None else argv)))
    setup_launcher_logging()
    cfg = load_cli_config(args)
    prepare_initial_weights(cfg)
    report_user_errors(lambda: launch(train_worker, cfg, local_rank=args.local_rank))


if __name__ == "__main__":
    main()
