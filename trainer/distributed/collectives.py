"""Small collectives, each a no-op (or the identity) without a process group, and a state sent from one rank to
others tensor by tensor."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch.utils._pytree import tree_leaves, tree_map_only

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


@dataclass(frozen=True)
class _TensorSlot:
    """A tensor's place in a state's skeleton: what a receiver allocates, and whether it lives on the CPU (an
    optimizer's step counts: a GPU copy would cost a sync at each read)."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    on_cpu: bool

    @classmethod
    def of(cls, tensor: torch.Tensor) -> _TensorSlot:
        return cls(tuple(tensor.shape), tensor.dtype, tensor.device.type == "cpu")


def send_state(state: T | None, src: int, receivers: Sequence[int], device: torch.device) -> T:
    """Rank ``src``'s ``state`` (containers of tensors: an optimizer's state dict) on the ``receivers``: called by
    ``src`` and the receivers only, the other ranks go on. Its structure and small values are pickled, its tensors sent
    one by one on ``device`` (broadcast_object would pickle the whole state into one byte tensor: an optimizer's
    gigabytes held twice more and copied through host memory). A received tensor is on ``device``, or on the CPU
    where the sender's was."""
    if dist.get_rank() == src:
        assert state is not None
        skeleton = tree_map_only(torch.Tensor, _TensorSlot.of, state)
        tensors = [leaf for leaf in tree_leaves(state) if isinstance(leaf, torch.Tensor)]
        for dst in receivers:
            dist.send_object_list([skeleton], dst=dst)
            for tensor in tensors:
                dist.send(tensor.detach().to(device).contiguous(), dst=dst)
        return state
    box: list[Any] = [None]
    dist.recv_object_list(box, src=src)

    def receive(slot: _TensorSlot) -> torch.Tensor:
        tensor = torch.empty(slot.shape, dtype=slot.dtype, device=device)
        dist.recv(tensor, src=src)
        return tensor.cpu() if slot.on_cpu else tensor

    return tree_map_only(_TensorSlot, receive, box[0])  # the sender's leaf order


def all_gather_object(obj: T) -> list[T]:
    """Every rank's ``obj``, in rank order."""
    if not _active():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out
