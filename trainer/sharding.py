"""DDP_CONFIG.SHARDING fsdp2: a model too large for one device, sharded over the ranks with FSDP2
(``torch.distributed.fsdp.fully_shard``), instead of DistributedDataParallel's whole copy on every rank.

What is sharded: each transformer block of a Hugging Face ``transformers`` model (the modules of a class its
``_no_split_modules`` names that sit in a ModuleList: VideoMAE's and TimeSformer's encoder layers, V-JEPA 2's encoder,
predictor and pooler layers), each its own unit (gathered for its forward and backward, freed after), then the root,
which holds the rest (embeddings, head). A model without such blocks (the zoo's CNNs) is sharded at the root only, and
the log says so (and it needs FSDP_PARAM_DTYPE float32 if it has BatchNorm layers): its parameters, gradients and
optimizer state are still split over the ranks, but the whole model is gathered for each forward, so its peak memory
drops less.

Precision (MixedPrecisionPolicy): the sharded parameters and the optimizer state stay float32; the gathered parameters
the forward and backward compute in are DDP_CONFIG.FSDP_PARAM_DTYPE (bfloat16 by default; it works on CPUs over gloo
too), and gradients are reduced in float32. DDP_CONFIG.FSDP_ACTIVATION_CHECKPOINTING recomputes each block's
activations in the backward (refused for a model without blocks: there is nothing to checkpoint per block).

Checkpoints are DCP folders (trainer.checkpoint, "FSDP2 checkpoints") that resume on any number of processes; a DDP
checkpoint (one file) does not resume an FSDP2 run, nor the reverse: :func:`check_resume_kind` refuses it naming the
file. Not for a DISTRIBUTED: False run, nor with TRAIN.PRECISE_BN (trainer.config refuses both).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.nn.modules.batchnorm import _NormBase

from trainer.config import Config, ConfigError
from trainer.distributed import DistContext, all_gather_object
from trainer.errors import CheckpointError

log = logging.getLogger("trainer")

FSDP2 = "fsdp2"


def uses_fsdp2(cfg: Config) -> bool:
    return cfg.DDP_CONFIG.SHARDING == FSDP2


def transformer_blocks(model: nn.Module) -> list[tuple[nn.ModuleList, int]]:
    """(list, index) of each transformer block of ``model``: a module of a class its ``_no_split_modules`` names, in a
    ModuleList; none for a model that names no such class."""
    classes = set(getattr(model, "_no_split_modules", None) or ())
    return [(modules, i) for modules in model.modules() if isinstance(modules, nn.ModuleList)
            for i, block in enumerate(modules) if type(block).__name__ in classes]


def shard_model(model: nn.Module, ctx: DistContext, cfg: Config) -> nn.Module:
    """``model`` (on its device, not wrapped) sharded over the job's ranks in place, as described above; returned."""
    ddp = cfg.DDP_CONFIG
    name = cfg.CONFIG.MODEL.NAME
    blocks = transformer_blocks(model)
    if ddp.FSDP_ACTIVATION_CHECKPOINTING and not blocks:
        raise ConfigError(f"DDP_CONFIG.FSDP_ACTIVATION_CHECKPOINTING: model {name} has no transformer blocks to "
                          "checkpoint; set it to False")
    if ddp.FSDP_PARAM_DTYPE != "float32" and any(isinstance(m, _NormBase) and m.running_mean is not None
                                                 for m in model.modules()):
        # FSDP2 casts parameters, not buffers: batch_norm would get bf16 weights and float32 running statistics.
        raise ConfigError(f"DDP_CONFIG.FSDP_PARAM_DTYPE: model {name} has BatchNorm layers, which cannot compute in "
                          f"{ddp.FSDP_PARAM_DTYPE} under FSDP2 (their running statistics stay float32); set it to "
                          "float32")
    policy = MixedPrecisionPolicy(param_dtype=getattr(torch, ddp.FSDP_PARAM_DTYPE), reduce_dtype=torch.float32)
    for modules, i in blocks:
        if ddp.FSDP_ACTIVATION_CHECKPOINTING:
            # The wrapper's own name in the parameter names is left out of every state dict (torch strips it).
            modules[i] = checkpoint_wrapper(modules[i])
        fully_shard(modules[i], mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    if blocks:
        log.info("FSDP2: model %s sharded over %d rank(s) in %d transformer block(s) and the root; compute in %s%s",
                 name, ctx.world_size, len(blocks), ddp.FSDP_PARAM_DTYPE,
                 ", activations recomputed per block" if ddp.FSDP_ACTIVATION_CHECKPOINTING else "")
    else:
        log.warning("FSDP2: model %s has no transformer blocks: sharded over %d rank(s) at the root only (the whole "
                    "model is gathered for each forward); compute in %s", name, ctx.world_size, ddp.FSDP_PARAM_DTYPE)
    return model


def is_sharded(model: nn.Module) -> bool:
    return isinstance(getattr(model, "_orig_mod", model), FSDPModule)


def full_model_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's state dict on every rank (a sharded model's gathered: every rank calls it), names as the
    plain module's."""
    if not is_sharded(model):
        return model.state_dict()
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))


def check_resume_kind(ckpt: dict[str, Any], cfg: Config) -> None:
    """CheckpointError naming the file when the checkpoint a run resumes from was written under the other
    DDP_CONFIG.SHARDING (an FSDP2 one carries ``sharding: fsdp2``)."""
    written = ckpt.get("sharding", "ddp")
    if written == cfg.DDP_CONFIG.SHARDING:
        return
    if written == FSDP2:
        raise CheckpointError(
            f"CONFIG.TRAIN.RESUME: {ckpt['path']} is an FSDP2 checkpoint (a DCP folder, its optimizer state keyed by "
            "parameter name), which a DDP run cannot take; resume it with DDP_CONFIG.SHARDING: fsdp2 (on any number "
            "of processes)"
        )
    raise CheckpointError(
        f"CONFIG.TRAIN.RESUME: {ckpt['path']} is a DDP checkpoint (one file), which an FSDP2 run cannot take (it "
        "resumes from FSDP2 checkpoint folders, *.dcp); resume it with DDP_CONFIG.SHARDING: ddp"
    )


def require_one_checkpoint_dir(ctx: DistContext, writes_checkpoints: bool, run_dir: Path) -> None:
    """Every rank: ConfigError unless every node's processes see rank 0's run directory (checkpoint.writes_checkpoints
    found node 1 sharing it, so rank 0 alone writes), as every rank writes its shards into one folder."""
    writers = [rank for rank, writes in enumerate(all_gather_object(writes_checkpoints)) if writes]
    if writers != [0]:
        raise ConfigError(
            f"DDP_CONFIG.SHARDING: fsdp2 writes every rank's shards into one checkpoint folder, and rank {writers[-1]} "
            f"does not see rank 0's run directory {run_dir}; put CONFIG.LOG.BASE_PATH on storage every node shares"
        )
