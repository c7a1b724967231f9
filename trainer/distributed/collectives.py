"""Small collectives: each is a no-op (or the identity) when there is no process group."""

from __future__ import annotations

from typing import Any, TypeVar

import torch
import torch.distributed as dist

from trainer.distributed.context import DistContext

T = TypeVar("T")


def _active() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def barrier(ctx: DistContext) -> None:
    if ctx.distributed and _active():
        dist.barrier()


def all_reduce_sum(tensor: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Sum ``tensor`` over all processes (of ``group``, default: the job's group), in place; returns it."""
    if _active():
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
    return tensor


def any_rank(flag: bool, ctx: DistContext) -> bool:
    """True on every rank when ``flag`` is True on any rank: one all-reduce, so every rank calls it at the same
    point (a rank that skips a collective its peers run makes them wait until the timeout)."""
    if not _active():
        return flag
    votes = torch.tensor([1.0 if flag else 0.0], device=ctx.device)
    return all_reduce_sum(votes).item() > 0


def host_group() -> dist.ProcessGroup | None:
    """A group for small collectives of CPU tensors that must not wait for a GPU: a gloo group beside an nccl job,
    the job's own group (None) on gloo or without one. Every process must call it, at the same point."""
    if not _active() or dist.get_backend() == "gloo":
        return None
    return dist.new_group(backend="gloo")


def broadcast_buffers(module: torch.nn.Module, src: int = 0) -> None:
    """Copy rank ``src``'s buffers (BatchNorm running stats) to every rank, in place.

    Each rank's running statistics follow its own batches during an epoch (DDP is told not to broadcast them before
    every forward: accel.wrap_ddp); evaluation and the final weights need rank 0's."""
    if _active():
        for buffer in module.buffers():
            dist.broadcast(buffer, src=src)


def broadcast_object(obj: T, src: int = 0) -> T:
    """Rank ``src``'s ``obj`` on every rank (picklable objects)."""
    if not _active():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def all_gather_object(obj: T) -> list[T]:
    """Every rank's ``obj``, in rank order."""
    if not _active():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out
