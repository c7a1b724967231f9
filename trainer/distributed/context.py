"""This process's place in the job (DistContext), how the workers of a node join it (Plan), and the errors of both."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trainer.errors import UserError
from trainer.runtime.contract import EXIT_PEER_LOST


class DistributedError(UserError, RuntimeError):
    """Ranks cannot be decided from the config (bad input); the message says what to change."""


class PeerError(DistributedError):
    """Peers did not meet, a peer went away, or a worker failed: one line, but not the input's fault, so not its exit
    status: a restart may help (exit status 1)."""

    exit_status = EXIT_PEER_LOST


@dataclass(frozen=True)
class DistContext:
    """This process's place in the job; the non-distributed case has the same fields (rank 0 of 1)."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    num_nodes: int
    device: torch.device
    backend: str
    distributed: bool
    dist_url: str

    @property
    def is_main(self) -> bool:
        return self.rank == 0


@dataclass(frozen=True)
class Plan:
    """How the workers of this node join the job (picklable: it travels to spawned workers)."""

    node_rank: int
    num_nodes: int
    per_node: int
    backend: str
    dist_url: str
    init_method: str
    timeout_s: int
    use_cuda: bool
    source: str  # who decided the ranks: "config", "torchrun" or "srun"

    @property
    def from_env(self) -> bool:
        return self.source != "config"

    def context(self, local_rank: int, rank: int | None = None, world_size: int | None = None) -> DistContext:
        return DistContext(
            rank=self.node_rank * self.per_node + local_rank if rank is None else rank,
            world_size=self.num_nodes * self.per_node if world_size is None else world_size,
            local_rank=local_rank,
            local_world_size=self.per_node,
            node_rank=self.node_rank,
            num_nodes=self.num_nodes,
            device=torch.device("cuda", gpu_index(local_rank, torch.cuda.device_count())) if self.use_cuda
            else torch.device("cpu"),
            backend=self.backend,
            distributed=True,
            dist_url=self.dist_url,
        )


def gpu_index(local_rank: int, visible: int) -> int:
    """The GPU (as this process numbers them) of local worker ``local_rank``, which sees ``visible`` GPUs: its own
    index where every worker of the node sees them all (spawned workers, torchrun, srun --gres), and local_rank %
    visible = 0 where each sees its own alone (srun --gpus-per-task=1 gives each task one). A worker that sees several
    GPUs but not its own would share one with another worker: refused."""
    if visible == 1 or local_rank < visible:
        return local_rank % visible
    raise DistributedError(
        f"local worker {local_rank} sees {visible} GPUs (CUDA_VISIBLE_DEVICES, or what Slurm gave its task): it would "
        "share one with another worker; give every worker of a node all of its GPUs (srun --gres=gpu:N, torchrun) or "
        "one each (srun --gpus-per-task=1)")


def has_gpus() -> bool:
    return torch.cuda.is_available() and torch.cuda.device_count() > 0
