"""The GPU checks of test_gpu.py, each run in a process of its own that sees the GPUs (the test processes do not:
tests/conftest.py hides them).

    python -m tests.trainer._gpu_checks NAME [ARG]

Exit status 0 with one JSON line of figures on stdout when the check holds; EXIT_SKIP with the reason as the last
line when it cannot be checked on this machine (a CPU-only torchcodec, one GPU for a two-GPU check); anything else
is a failure, with its traceback.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn import functional as F
from torch.nn.modules._functions import SyncBatchNorm as SyncBatchNormFunction

from tests.ports import free_port
from trainer import engine
from trainer.accel import amp_dtype, autocast, ddp_module, grad_scaler, prepare_model, wrap_ddp
from trainer.config import Config, validate_config
from trainer.data.decoders import NATIVE, BadVideo, ClipDecoder, decode_device, open_reader, read_frames
from trainer.data.loader import stack_clips
from trainer.data.transforms import ClipNormalizer, Crop, make_crop, normalize
from trainer.distributed import DistContext, launch, single_process_context
from trainer.hardware import compile_problem, cuda_build, torchcodec_version
from trainer.models import build_model
from trainer.train import build_train_model

EXIT_SKIP = 77
CUDA = torch.device("cuda", 0)


class CannotCheck(Exception):
    """What this machine lacks for the check (its message is the skip reason)."""


def relative_error(actual: torch.Tensor | list[torch.Tensor], expected: torch.Tensor | list[torch.Tensor]) -> float:
    """||actual - expected|| / ||expected||, of one tensor or of a list taken as one vector (parameters of every
    size together: a tensor whose own change is tiny cannot dominate)."""
    def flat(tensors: torch.Tensor | list[torch.Tensor]) -> torch.Tensor:
        parts = [tensors] if isinstance(tensors, torch.Tensor) else tensors
        return torch.cat([t.detach().float().cpu().flatten() for t in parts])

    expected_flat = flat(expected)
    return ((flat(actual) - expected_flat).norm() / expected_flat.norm().clamp_min(1e-12)).item()


def clips(count: int, frames: int = 8, size: int = 32, seed: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Seeded (clips, labels) batches of 4 on the GPU: the same data for every run of a check."""
    gen = torch.Generator().manual_seed(seed)
    for _ in range(count):
        yield (torch.randn(4, 3, frames, size, size, generator=gen).to(CUDA),
               torch.randint(0, 5, (4,), generator=gen).to(CUDA))


# ---------------------------------------------------------------------------------------------------------------------
# What the trainer computes in and with: float32 meets every tolerance the comparisons below allow, and a model without
# SyncBatchNorm trains as well on one GPU, so the checks also look inside (CPU tests: test_gpu_checks_on_cpu.py).

COMPUTE_LAYERS = (nn.modules.conv._ConvNd, nn.Linear)


def activation_dtypes(model: nn.Module, forward: Callable[[], object]) -> dict[str, list[str]]:
    """{layer class: the dtypes of its outputs} of every convolution and linear layer of ``model`` while ``forward()``
    runs (forward hooks): bf16 or fp16 under autocast, float32 without it."""
    seen: dict[str, set[str]] = {}

    def record(module: nn.Module, _inputs: object, output: object) -> None:
        if isinstance(output, torch.Tensor):
            seen.setdefault(type(module).__name__, set()).add(str(output.dtype).removeprefix("torch."))

    handles = [m.register_forward_hook(record) for m in model.modules() if isinstance(m, COMPUTE_LAYERS)]
    try:
        forward()
    finally:
        for handle in handles:
            handle.remove()
    return {name: sorted(dtypes) for name, dtypes in sorted(seen.items())}


def compute_dtype_problem(dtypes: dict[str, list[str]], expected: torch.dtype) -> str | None:
    """None when every layer computed in ``expected``, else what did not."""
    name = str(expected).removeprefix("torch.")
    if not dtypes:
        return "no convolution or linear layer ran"
    wrong = {layer: found for layer, found in dtypes.items() if found != [name]}
    return f"layers computed in {wrong}, not {name} (is autocast missing?)" if wrong else None


def engine_forward_dtypes(model: nn.Module, clip: torch.Tensor, labels: torch.Tensor, cfg: Config,
                          ctx: DistContext) -> dict[str, list[str]]:
    """activation_dtypes of the trainer's own training forward (engine._forward_loss, its autocast as
    CONFIG.TRAIN.AMP says), on a batch already on the device."""
    batch = {"video": clip, "label": labels}

    def passthrough(video: torch.Tensor, _crops: object = None) -> torch.Tensor:  # the clips are model input already
        return video

    return activation_dtypes(model, lambda: engine._forward_loss(model, batch, nn.CrossEntropyLoss(), cfg, ctx,
                                                                 passthrough, False))  # type: ignore[arg-type]


def batchnorm_kinds(model: nn.Module) -> dict[str, int]:
    """{class name: count} of the model's batch norm layers: all SyncBatchNorm after the trainer's SYNC_BN."""
    kinds: dict[str, int] = {}
    for module in model.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            kinds[type(module).__name__] = kinds.get(type(module).__name__, 0) + 1
    return kinds


def amp_config(amp: str, **train: Any) -> Config:
    return validate_config({"DDP_CONFIG": {"DISTRIBUTED": False},
                            "CONFIG": {"MODEL": {"NAME": "i3d_tiny"}, "DATA": {"NUM_CLASSES": 5},
                                       "TRAIN": {"AMP": amp, **train}}})


def sync_bn_model(device: torch.device) -> nn.Module:
    """The trainer's model (train.build_train_model) for a distributed process with SYNC_BN, before DDP."""
    cfg = amp_config("off", SYNC_BN=True)
    ctx = dataclasses.replace(single_process_context(cfg), device=device, distributed=True, world_size=2)
    return build_train_model(cfg, ctx)


# ---------------------------------------------------------------------------------------------------------------------
# AMP


def train_steps(amp: str) -> dict[str, Any]:
    """Four SGD steps of a tiny I3D as train.py takes them (autocast, the gradient scaler for fp16 only), and what
    they give: the losses, the weights' move, logits on held-out clips."""
    torch.manual_seed(0)
    model = build_model("i3d_tiny", 5, dropout=0.0).to(CUDA)
    initial = {name: p.detach().clone() for name, p in model.named_parameters()}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scaler = grad_scaler(CUDA, amp)
    ctx = single_process_context(validate_config({"DDP_CONFIG": {"DISTRIBUTED": False}}))
    expected_dtype = amp_dtype(CUDA, amp) or torch.float32
    losses = []
    for x, y in clips(4):
        with autocast(ctx, amp):
            logits = model(x)
            loss = F.cross_entropy(logits, y)
        assert logits.dtype == expected_dtype, f"AMP {amp}: logits in {logits.dtype}, not {expected_dtype}"
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    held_out = next(clips(1, seed=1))[0]
    with torch.no_grad():
        logits = model.eval()(held_out).float()
    moved = [p.detach() - initial[name] for name, p in model.named_parameters()]
    return {"losses": losses, "moved": moved, "logits": logits, "scale": scaler.get_scale() if scaler.is_enabled()
            else None}


def check_engine_computes_in(amp: str) -> dict[str, list[str]]:
    """The trainer's training forward under CONFIG.TRAIN.AMP ``amp`` computes every layer in the dtype amp_dtype
    says (bf16 or fp16; float32 for off)."""
    torch.manual_seed(0)
    cfg = amp_config(amp)
    model = build_model("i3d_tiny", 5, dropout=0.0).to(CUDA)
    clip, labels = next(clips(1))
    dtypes = engine_forward_dtypes(model, clip, labels, cfg, single_process_context(cfg))
    problem = compute_dtype_problem(dtypes, amp_dtype(CUDA, amp) or torch.float32)
    assert problem is None, f"AMP {amp}: the engine's forward {problem}"
    return dtypes


def check_amp() -> dict[str, Any]:
    """bf16 and fp16 (with the gradient scaler) against float32: the engine's forward computes in the AMP dtype
    (activation_dtypes), and training gives the same losses, the same weight updates (an fp16 step the scaler forgot
    to unscale would move the weights 65536x as far) and logits, within a tolerance."""
    reference = train_steps("off")
    figures: dict[str, Any] = {"auto": check_engine_computes_in("auto")}
    for amp, tolerance in (("bf16", 0.1), ("fp16", 0.05)):
        if amp == "bf16" and not torch.cuda.is_bf16_supported(including_emulation=False):
            figures[amp] = "not checked: this GPU has no bf16"
            continue
        computes_in = check_engine_computes_in(amp)
        run = train_steps(amp)
        loss_error = max(abs(a - b) / abs(b) for a, b in zip(run["losses"], reference["losses"], strict=True))
        move_error = relative_error(run["moved"], reference["moved"])
        logit_error = relative_error(run["logits"], reference["logits"])
        figures[amp] = {"loss": round(loss_error, 5), "weight_update": round(move_error, 5),
                        "logits": round(logit_error, 5), "scale": run["scale"], "computes_in": computes_in}
        assert max(loss_error, move_error, logit_error) < tolerance, f"AMP {amp} against float32: {figures[amp]}"
    assert reference["scale"] is None and figures["fp16"]["scale"] is not None  # the scaler runs for fp16 only
    return figures


# ---------------------------------------------------------------------------------------------------------------------
# SyncBatchNorm


def sync_bn_rank(rank: int, world: int, port: int, results: str) -> None:
    """Rank ``rank``'s share of a batch through SyncBatchNorm (forward, backward, running statistics), saved for the
    comparison with BatchNorm over the whole batch."""
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        device = torch.device("cuda", rank)
        full, weights = sync_bn_data(device)
        share = full.chunk(world)[rank].detach().requires_grad_()
        bn = nn.SyncBatchNorm(6).to(device)
        with torch.no_grad():
            bn.weight.copy_(torch.linspace(0.5, 1.5, 6))
            bn.bias.copy_(torch.linspace(-0.2, 0.2, 6))
        if world > 1:
            out = bn(share)  # what the trainer's converted model runs
        else:  # a world of one takes BatchNorm's path in the module: drive the synchronising kernels themselves
            out = SyncBatchNormFunction.apply(share, bn.weight, bn.bias, bn.running_mean, bn.running_var, bn.eps,
                                              bn.momentum, dist.group.WORLD, world)
        (out * weights.chunk(world)[rank]).sum().backward()
        for tensor in (bn.weight.grad, bn.bias.grad):  # each rank holds its share's part; DDP sums them
            dist.all_reduce(tensor)
        torch.save({"out": out.detach().cpu(), "grad": share.grad.cpu(), "weight_grad": bn.weight.grad.cpu(),
                    "bias_grad": bn.bias.grad.cpu(), "running_mean": bn.running_mean.cpu(),
                    "running_var": bn.running_var.cpu()}, f"{results}/{rank}.pt")
    finally:
        dist.destroy_process_group()


def sync_bn_data(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    full = torch.randn(4, 6, 4, 8, 8, generator=gen) * 3 + 1
    return full.to(device), torch.randn(full.shape, generator=gen).to(device)


def check_sync_bn(world: str) -> dict[str, Any]:
    """The trainer's model with SYNC_BN has SyncBatchNorm layers and no other batch norm; SyncBatchNorm over ``world``
    processes, one GPU each, against BatchNorm3d over the whole batch on one GPU: outputs, input and parameter
    gradients, running statistics."""
    processes = int(world)
    if torch.cuda.device_count() < processes:
        raise CannotCheck(f"needs {processes} GPUs, {torch.cuda.device_count()} visible")
    kinds = batchnorm_kinds(sync_bn_model(CUDA))
    assert set(kinds) == {"SyncBatchNorm"}, f"the trainer's SYNC_BN model has batch norm layers {kinds}"
    with tempfile.TemporaryDirectory() as results:
        mp.spawn(sync_bn_rank, args=(processes, free_port(), results), nprocs=processes, join=True)
        shares = [torch.load(f"{results}/{rank}.pt", weights_only=True) for rank in range(processes)]
    full, weights = sync_bn_data(CUDA)
    full.requires_grad_()
    bn = nn.BatchNorm3d(6).to(CUDA)
    with torch.no_grad():
        bn.weight.copy_(torch.linspace(0.5, 1.5, 6))
        bn.bias.copy_(torch.linspace(-0.2, 0.2, 6))
    out = bn(full)
    (out * weights).sum().backward()
    expected = {"out": out, "grad": full.grad, "weight_grad": bn.weight.grad, "bias_grad": bn.bias.grad,
                "running_mean": bn.running_mean, "running_var": bn.running_var}
    errors = {}
    for key, tensor in expected.items():
        per_rank = key in ("out", "grad")  # the others are the same on every rank
        actual = torch.cat([share[key] for share in shares]) if per_rank else shares[0][key]
        errors[key] = relative_error(actual, tensor)
    assert max(errors.values()) < 1e-4, f"SyncBatchNorm over {processes} process(es) against BatchNorm: {errors}"
    return {"processes": processes, "path": "module" if processes > 1 else "synchronising kernels",
            "max_relative_error": max(errors.values()), "trainer_batchnorm": kinds}


# ---------------------------------------------------------------------------------------------------------------------
# The device of a single-process run


def check_single_process_device() -> dict[str, Any]:
    """launch() with DISTRIBUTED False and DDP_CONFIG.GPU 1: the worker's device is GPU 1, and so is the current
    device (set_device), where a tensor made without a device goes."""
    if torch.cuda.device_count() < 2:
        raise CannotCheck(f"needs 2 GPUs, {torch.cuda.device_count()} visible")
    seen: dict[str, Any] = {}

    def worker(ctx: DistContext, _cfg: Config) -> None:
        seen.update(device=str(ctx.device), current=torch.cuda.current_device(),
                    allocated=str(torch.empty(1, device="cuda").device))

    launch(worker, validate_config({"DDP_CONFIG": {"DISTRIBUTED": False, "GPU": 1}}))
    assert seen == {"device": "cuda:1", "current": 1, "allocated": "cuda:1"}, seen
    return seen


# ---------------------------------------------------------------------------------------------------------------------
# Crops made on the GPU


def check_gpu_crops() -> dict[str, Any]:
    """A batch of uint8 regions (enlarged and shrunk, some flipped), made into crops on the GPU (ClipNormalizer, as
    a GPU node trains) and on a CPU-only node's way (the worker's uint8 crop, normalised): within one level."""
    mean, std, size = (0.45, 0.4, 0.35), (0.225, 0.25, 0.2), 56
    gen = torch.Generator().manual_seed(0)
    regions = [torch.randint(0, 256, (4, side, side, 3), dtype=torch.uint8, generator=gen).permute(3, 0, 1, 2)
               for side in (19, 40, 56, 80, 112, 168)]  # [C, T, s, s] views of [T, s, s, C] frames, as decoded
    flips = [False, True, False, True, True, False]
    batch = stack_clips(regions)
    plans = [(region.shape[-1], size, flip) for region, flip in zip(regions, flips, strict=True)]
    on_gpu = ClipNormalizer(mean, std, CUDA, torch.channels_last_3d)(batch.pin_memory(), plans)
    assert on_gpu.device == CUDA and on_gpu.is_contiguous(memory_format=torch.channels_last_3d)
    on_cpu = torch.stack([normalize(make_crop(Crop(region, size, flip)), mean, std)
                          for region, flip in zip(regions, flips, strict=True)])
    levels = (on_gpu.cpu() - on_cpu).abs() * 255 * torch.tensor(std).view(1, 3, 1, 1, 1)
    assert levels.max() <= 1.0 + 1e-3, f"GPU crops differ from the CPU's by up to {levels.max():.3f} levels"
    return {"max_levels": round(levels.max().item(), 4), "mean_levels": round(levels.mean().item(), 4)}


# ---------------------------------------------------------------------------------------------------------------------
# Decoding on the GPU


def check_cuda_decoding(video: str) -> dict[str, Any]:
    """DECODER_DEVICE cuda (torchcodec on NVDEC) against the CPU: the same frames, within a few levels (YUV to RGB
    runs on the GPU there); and under the time limit (a spawned helper) the same frames as without it. What the
    machine lacks for it (a torchcodec built with CUDA, FFmpeg libraries that can hand frames to NVDEC: torchcodec
    then decodes on the CPU and says why) is reported as not checked; a video that a CUDA build cannot open or decode
    on the GPU fails the check."""
    from trainer.data.decoders import torchcodec_problem

    problem = torchcodec_problem()
    version = torchcodec_version()
    if problem is None and not cuda_build(version):
        problem = f"torchcodec {version} is a CPU-only build"
    if problem is not None:
        raise CannotCheck(f"CUDA decoding: {problem}")
    warnings: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: warnings.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("trainer").addHandler(handler)
    device = decode_device("cuda", 0)
    assert device == "cuda:0", device
    try:
        reader = open_reader("torchcodec", video, NATIVE, device)
    except BadVideo as exc:  # a decode error: what this check is for, not something the machine lacks
        raise AssertionError(f"CUDA decoding: torchcodec cannot open {video} on the GPU: {exc}") from exc
    indices = torch.tensor([40, 0, 7, 8, 9, 15, 31, 3, 3, 12]).numpy()
    on_gpu = read_frames(reader, indices)
    if warnings:  # "torchcodec decodes on the CPU instead of cuda:0: <why>"
        raise CannotCheck(f"CUDA decoding: {warnings[0]}")
    on_cpu = read_frames(open_reader("torchcodec", video), indices)
    assert on_gpu.device.type == "cuda" and on_gpu.shape == on_cpu.shape and on_gpu.dtype == torch.uint8
    diff = (on_gpu.cpu().int() - on_cpu.int()).abs().float()
    # each GPU frame is the CPU's frame at its index, far nearer to it than to any other
    distance = (on_gpu.cpu()[:, None].int() - on_cpu[None].int()).abs().float().mean(dim=(2, 3, 4))
    assert (indices[distance.argmin(dim=1).numpy()] == indices).all(), distance
    assert diff.mean() < 4.0, f"GPU frames differ from the CPU's by {diff.mean():.2f} levels on average"
    # under DECODE_TIME_LIMIT: decoded on the GPU in a spawned helper, the same frames back on the GPU
    limited = ClipDecoder("torchcodec", NATIVE, "cuda", 0, time_limit=120.0)
    assert limited.time_limit is not None and limited.time_limit.spawn is not None
    in_helper = limited.clip(video, lambda _: indices).frames
    assert in_helper.device == on_gpu.device and torch.equal(in_helper, on_gpu)
    return {"mean_levels": round(diff.mean().item(), 3), "max_levels": int(diff.max().item())}


# ---------------------------------------------------------------------------------------------------------------------
# channels_last and torch.compile


def forward_backward(model: nn.Module, clip: torch.Tensor) -> dict[str, Any]:
    """The outputs of a training step and every parameter's gradient (in the module's order)."""
    out = model(clip)
    out.sum().backward()
    grads = [p.grad.detach().clone() for p in ddp_module(model).parameters()]
    model.zero_grad(set_to_none=True)
    return {"out": out.detach(), "gradients": grads}


def check_training_step_unchanged_by(key: str) -> dict[str, Any]:
    """The trainer's TRAIN.CHANNELS_LAST or TRAIN.COMPILE on the GPU: outputs and gradients of a training step of a
    tiny SlowFast as without it (cuDNN and Triton pick other kernels: within float32's, and TF32's, rounding)."""
    torch.manual_seed(0)
    plain = build_model("slowfast_tiny", 3, dropout=0.0).to(CUDA)  # train mode: batch statistics
    clip = next(clips(1, frames=16))[0]
    expected = forward_backward(plain, clip)
    cfg = validate_config({"DDP_CONFIG": {"DISTRIBUTED": False}, "CONFIG": {"TRAIN": {key: True}}})
    model = build_model("slowfast_tiny", 3, dropout=0.0).to(CUDA)
    model.load_state_dict(plain.state_dict())
    fast = wrap_ddp(prepare_model(model, cfg), single_process_context(cfg), cfg)
    if key == "CHANNELS_LAST":
        assert next(p for p in fast.parameters() if p.dim() == 5).is_contiguous(memory_format=torch.channels_last_3d)
        clip = clip.contiguous(memory_format=torch.channels_last_3d)
    got = forward_backward(fast, clip)
    errors = {part: relative_error(got[part], expected[part]) for part in ("out", "gradients")}
    assert max(errors.values()) < 1e-2, f"{key} against neither: {errors}"
    return {key.lower(): errors}


def check_channels_last() -> dict[str, Any]:
    return check_training_step_unchanged_by("CHANNELS_LAST")


def check_compile() -> dict[str, Any]:
    """torch.compile needs a C compiler and Python.h (trainer.hardware): without them, not checked, saying which."""
    problem = compile_problem("cuda")
    if problem is not None:
        raise CannotCheck(f"compile: not checked, {problem.split(': ', 1)[1]}")
    return check_training_step_unchanged_by("COMPILE")


CHECKS: dict[str, Callable[..., dict[str, Any]]] = {
    "amp": check_amp,
    "sync_bn": check_sync_bn,
    "single_process_device": check_single_process_device,
    "gpu_crops": check_gpu_crops,
    "cuda_decoding": check_cuda_decoding,
    "channels_last": check_channels_last,
    "compile": check_compile,
}


def main(argv: list[str]) -> int:
    if not torch.cuda.is_available():
        print("no GPU visible to this process", file=sys.stderr)
        return EXIT_SKIP
    name, *args = argv
    try:
        figures = CHECKS[name](*args)
    except CannotCheck as exc:
        print(exc)
        return EXIT_SKIP
    print(json.dumps({"check": name, "gpu": torch.cuda.get_device_name(CUDA), **figures}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
