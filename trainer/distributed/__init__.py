"""Who am I in the job, start the workers, and the process group around them.

Ranks come from, in this order:

1. ``DDP_CONFIG.DISTRIBUTED: False``: one process, no process group, no collective calls.
2. torchrun / ``torch.distributed.launch`` (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT in the
   environment): the environment decides, ``init_method='env://'``.
3. a task of a plain ``srun`` (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID and SLURM_STEP_ID in the environment; the
   batch script itself has no SLURM_STEP_ID): each task is one worker, rank SLURM_PROCID of SLURM_NTASKS, local index
   SLURM_LOCALID, node SLURM_NODEID, GPU local index % the GPUs it sees (``gpu_index``: the one it sees under
   --gpus-per-task=1). The rendezvous is MASTER_ADDR:MASTER_PORT when the environment sets them, else
   the step's first node (``scontrol show hostnames``, then that node's NodeAddr from ``scontrol show node``) at
   port 15000 + SLURM_JOB_ID mod 10000; a node list scontrol cannot read is an error naming it, never a guess.
4. a legacy ``--local_rank N`` / ``--local-rank N`` argument without that environment: this process is local worker N of
   node WORLD_RANK, rendezvous at DIST_URL.
5. otherwise (the GluonCV way, ``python -m trainer.train --config-file node.yaml`` on every node): this node's rank is
   WORLD_RANK, or found by AUTO_RANK_MATCH among WOLRD_URLS, and one worker per GPU (DDP_CONFIG.CPU_WORKERS on a node
   without GPUs) is spawned with global rank WORLD_RANK * workers_per_node + local index.

A GPU worker binds itself to the CPUs of its GPU's socket before it joins (``trainer.numa``: its loader workers inherit
them). Every worker joins the group with ``timeout=DDP_CONFIG.TIMEOUT_SECONDS``; a peer that does not arrive in time
ends the run with a DistributedError naming the rendezvous address. The group is destroyed when the worker returns, and
aborted when it raises (``abort_groups``: its peers may be gone, and nccl's graceful destroy would wait for them), and a
worker's exception makes ``launch`` raise: a spawned worker's UserError comes back as a UserError with the same
one-line message (no traceback: the input was bad, not the code), its Preempted as a Preempted (so the command's exit
status is the worker's: trainer.errors), any other exception as a DistributedError after its traceback is logged. The
process that spawns workers passes SIGTERM and SIGUSR1 on to them (errors.STOP_SIGNALS: how a stop is asked for).

| module | its one job |
|---|---|
| context | this process's place in the job (DistContext), a node's plan to join it, the errors of both |
| ranks | the rank sources above, each giving a plan |
| process_group | join the group within TIMEOUT_SECONDS, leave it, abort it, join the next attempt's |
| workers | run this node's workers, in this process or spawned; stop signals; a worker's failure as one exception |
| collectives | small collectives and a state sent tensor by tensor, no-ops without a group |

This host's interfaces and addresses are ``trainer.runtime.host.network``'s (standard library: the runtime uses them
too).
"""

from trainer.distributed.collectives import (
    all_gather_object,
    all_reduce_sum,
    any_rank,
    barrier,
    broadcast_buffers,
    broadcast_object,
    host_group,
    send_state,
)
from trainer.distributed.context import DistContext, DistributedError, PeerError, gpu_index
from trainer.distributed.process_group import abort_groups, rejoin
from trainer.distributed.ranks import add_launcher_args, resolve_node_rank, single_process_context
from trainer.distributed.workers import launch

__all__ = [
    "DistContext",
    "DistributedError",
    "PeerError",
    "abort_groups",
    "add_launcher_args",
    "all_gather_object",
    "all_reduce_sum",
    "any_rank",
    "barrier",
    "broadcast_buffers",
    "broadcast_object",
    "gpu_index",
    "host_group",
    "launch",
    "rejoin",
    "resolve_node_rank",
    "send_state",
    "single_process_context",
]
