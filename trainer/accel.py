"""How the model runs fast on its device: mixed precision, memory order, torch.compile, cuDNN autotuning, DDP.

The CONFIG.TRAIN keys, and what they do where:

| key | CUDA | CPU |
|---|---|---|
| AMP auto (default) | bf16 autocast where the GPU has bf16 (compute capability 8.0+), else fp16 (scaled) | float32 |
| AMP bf16 / fp16 / off | that autocast (fp16 with a gradient scaler; bf16 refused before 8.0) / float32 | float32 |
| CHANNELS_LAST | model and clips in channels_last_3d order | the same (results equal to float tolerance) |
| COMPILE | torch.compile of the training model (DDP-aware: compiled after wrapping) | the same (inductor, C++) |
| CUDNN_BENCHMARK | cudnn.benchmark: per-shape algorithm search | no cuDNN: nothing to tune |
| DDP_BUCKET_CAP_MB | gradient bucket size of the all-reduce | the same (gloo) |

Under DDP_CONFIG.SHARDING fsdp2 the model is sharded (trainer.sharding) instead of wrapped in DDP; the rest holds.

DDP always uses ``gradient_as_bucket_view`` (gradients live in the all-reduce buckets: no copy, less memory) and
``static_graph`` (DDP records the first iteration's graph and skips the per-iteration search for unused parameters)
unless some parameters may go unused in a forward (FIND_UNUSED_PARAMETERS, or a model that says so), gradients
accumulate (ACCUM_STEPS > 1: DDP's static graph does not support ``no_sync``) or the model is compiled (COMPILE:
TorchDynamo's DDP optimizer splits the graph at bucket boundaries, which DDP's static graph does not support).
It does not broadcast rank 0's buffers (BatchNorm running statistics) before every forward, a collective per step:
training never reads them, and the trainer broadcasts them once after each epoch (distributed.broadcast_buffers),
before anything does; rank 0's statistics evolve the same either way, so the result is the same.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from trainer.compat import DDP_NO_FORWARD_BUFFER_SYNC
from trainer.config import Config
from trainer.data.dataset import ClipSpec
from trainer.data.transforms import ClipNormalizer
from trainer.distributed import DistContext
from trainer.hardware import BF16_CAPABILITY
from trainer.sharding import shard_model, uses_fsdp2


def autocast_dtype(amp: str, capability: tuple[int, int] | None) -> torch.dtype | None:
    """The autocast dtype CONFIG.TRAIN.AMP gives on a GPU of compute ``capability`` (None: not a GPU); None =
    float32. auto is bf16 where the GPU has bf16 units (8.0, Ampere, and newer), else fp16: a V100's or T4's tensor
    cores run fp16 alone, and float32 would leave them idle (the gradient scaler keeps fp16's gradients finite)."""
    if capability is None or amp == "off":
        return None
    if amp == "auto":
        amp = "bf16" if tuple(capability) >= BF16_CAPABILITY else "fp16"
    return torch.bfloat16 if amp == "bf16" else torch.float16


def amp_dtype(device: torch.device, amp: str) -> torch.dtype | None:
    """The autocast dtype CONFIG.TRAIN.AMP gives on ``device``; None = float32."""
    return autocast_dtype(amp, torch.cuda.get_device_capability(device) if device.type == "cuda" else None)


def uses_grad_scaler(dtype: torch.dtype | None) -> bool:
    """Whether autocast in ``dtype`` needs the gradient scaler: fp16 alone (its narrow exponent range lets small
    gradients underflow to zero; bf16 has float32's range)."""
    return dtype == torch.float16


def grad_scaler(device: torch.device, amp: str) -> torch.amp.GradScaler:
    """The training's gradient scaler: enabled where CONFIG.TRAIN.AMP autocasts to fp16 on ``device``."""
    return torch.amp.GradScaler(device.type, enabled=uses_grad_scaler(amp_dtype(device, amp)))


def autocast(ctx: DistContext, amp: str) -> contextlib.AbstractContextManager[Any]:
    """Autocast as CONFIG.TRAIN.AMP says for this process's device (a no-op in float32)."""
    dtype = amp_dtype(ctx.device, amp)
    return contextlib.nullcontext() if dtype is None else torch.autocast("cuda", dtype=dtype)


def memory_format(cfg: Config) -> torch.memory_format:
    return torch.channels_last_3d if cfg.CONFIG.TRAIN.CHANNELS_LAST else torch.contiguous_format


def clip_normalizer(cfg: Config, ctx: DistContext) -> ClipNormalizer:
    """What turns a loader's uint8 clips into model input on this process's device: the spec's mean/std (the
    trainer's resolved DATA.MEAN/STD), the model's memory order."""
    spec = ClipSpec.from_config(cfg)
    return ClipNormalizer(spec.mean, spec.std, ctx.device, memory_format(cfg))


def configure_backends(cfg: Config) -> None:
    """Process-wide switches: cuDNN's per-shape algorithm search (input shapes repeat every step)."""
    torch.backends.cudnn.benchmark = cfg.CONFIG.TRAIN.CUDNN_BENCHMARK


def prepare_model(model: nn.Module, cfg: Config) -> nn.Module:
    """The model in the configured memory order (in place)."""
    return model.to(memory_format=memory_format(cfg))


def wrap_ddp(model: nn.Module, ctx: DistContext, cfg: Config, micro_batches: int | None = None) -> nn.Module:
    """DistributedDataParallel as described above (the model itself when not distributed; sharded in place under
    SHARDING fsdp2), then torch.compile when COMPILE is on. ``micro_batches``: of an optimizer step, ACCUM_STEPS
    unless said (an elastic job in another world: trainer.elastic); a static graph only without no_sync."""
    train = cfg.CONFIG.TRAIN
    micro_batches = train.ACCUM_STEPS if micro_batches is None else micro_batches
    if ctx.distributed and uses_fsdp2(cfg):
        model = shard_model(model, ctx, cfg)
    elif ctx.distributed:
        find_unused = train.FIND_UNUSED_PARAMETERS or getattr(model, "needs_unused_parameters", False)
        model = DistributedDataParallel(
            model,
            device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None,
            find_unused_parameters=find_unused,
            static_graph=not find_unused and micro_batches == 1 and not train.COMPILE,
            gradient_as_bucket_view=True,
            bucket_cap_mb=train.DDP_BUCKET_CAP_MB,
            **DDP_NO_FORWARD_BUFFER_SYNC,  # rank 0's BatchNorm statistics reach every rank after each epoch instead
        )
    return torch.compile(model) if train.COMPILE else model


def unwrap_ddp(model: nn.Module) -> None:
    """Take the DDP wrapper's gradient hooks off the module it wraps, whose gradients are dropped too: the module
    outlives its wrapper (a process that restarts in place wraps it again in the next attempt's group)."""
    ddp = ddp_module(model)
    if isinstance(ddp, DistributedDataParallel):
        ddp._remove_autograd_hooks()
        model = ddp.module
    for param in model.parameters():
        param.grad = None


def ddp_module(model: nn.Module) -> nn.Module:
    """The DDP wrapper (or plain module) inside a compiled model."""
    return getattr(model, "_orig_mod", model)
