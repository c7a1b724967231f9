"""Checks of a config against this node, not only the file: what its GPUs, compiler and decoders can run (the rules
themselves are trainer.hardware's and trainer.data.decoders'). Imports neither torch nor decord until a rule needs
them: a controller without them runs ``python -m trainer.config --no-runtime-checks``."""

from __future__ import annotations

from trainer.config import Config, ConfigError
from trainer.hardware import check_config  # imports torch only where a rule needs it
from trainer.hf_models import missing_library


def check_runtime(cfg: Config) -> None:
    """Checks that need this machine, not only the file: a distributed nccl run needs a visible GPU, so does a
    distributed SYNC_BN (SyncBatchNorm works on GPU modules only), DECODER torchcodec or auto needs a torchcodec
    that loads FFmpeg's libraries, AMP bf16, COMPILE and DECODER_DEVICE cuda need what trainer.hardware says, and a
    transformers model (trainer.hf_models) needs that library."""
    library = missing_library(cfg.CONFIG.MODEL.NAME)
    if library is not None:
        raise ConfigError(library)
    problems = check_config(cfg)
    if problems:
        raise ConfigError("; ".join(problems))
    decoder = cfg.CONFIG.DATA.DECODER
    if decoder != "decord":
        from trainer.data.decoders import torchcodec_problem  # imports torch and decord: only on a node

        problem = torchcodec_problem()
        if problem is not None:
            raise ConfigError(f"CONFIG.DATA.DECODER: {decoder} needs torchcodec, which cannot run here: {problem}")
    ddp = cfg.DDP_CONFIG
    if not (ddp.DISTRIBUTED and (ddp.DIST_BACKEND == "nccl" or cfg.CONFIG.TRAIN.SYNC_BN)):
        return
    import torch  # here, not at the top: the controller validates files without torch installed

    if torch.cuda.is_available():
        return
    if ddp.DIST_BACKEND == "nccl":
        raise ConfigError(
            "DDP_CONFIG.DIST_BACKEND: nccl needs a GPU but none is visible on this machine; "
            "set DIST_BACKEND: 'gloo' to train on CPUs (or check the driver and CUDA_VISIBLE_DEVICES)"
        )
    raise ConfigError(
        "CONFIG.TRAIN.SYNC_BN: SyncBatchNorm synchronises statistics between GPU processes only, and no GPU is "
        "visible on this machine; turn SYNC_BN off to train on CPUs (or check the driver and CUDA_VISIBLE_DEVICES)"
    )
