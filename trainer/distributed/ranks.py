"""Who this process is in the job, from the sources ``trainer.distributed`` lists in their order: no process group
(DISTRIBUTED False), torchrun's environment, a task of srun (scontrol for the rank-0 node), a legacy
``--local_rank``, the config (WORLD_RANK, or AUTO_RANK_MATCH among WOLRD_URLS); each but the first gives a Plan."""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import re
import socket
import subprocess
from typing import Any

import torch

from trainer.config import Config, DDPConfig
from trainer.distributed.context import DistContext, DistributedError, Plan, has_gpus
from trainer.runtime.host.network import interface_addresses
from trainer.runtime.layout import url_host

log = logging.getLogger(__name__)

_TORCHRUN_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
_SRUN_ENV = ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_STEP_ID")
_SLURM_PORT_BASE = 15000  # + SLURM_JOB_ID mod 10000: the tasks of one job agree, two jobs on a node rarely clash


def _addresses_of(entry: str) -> set[str]:
    """The IP addresses a WOLRD_URLS entry stands for: itself if it is an IP, else what the name resolves to."""
    try:
        return {str(ipaddress.ip_address(entry))}
    except ValueError:
        pass
    try:
        return {str(ipaddress.ip_address(info[4][0])) for info in socket.getaddrinfo(entry, None)}
    except (OSError, ValueError):
        return set()


def resolve_node_rank(ddp: DDPConfig) -> int:
    """WORLD_RANK, or with AUTO_RANK_MATCH the index of the one WOLRD_URLS entry that is an address of this host."""
    if not ddp.AUTO_RANK_MATCH:
        return ddp.WORLD_RANK
    pairs = interface_addresses()
    local = {str(ipaddress.ip_address(addr)) for _, addr in pairs}
    matches = [i for i, entry in enumerate(ddp.WOLRD_URLS) if _addresses_of(entry) & local]
    if len(matches) == 1:
        rank = matches[0]
        ifaces = sorted({name for name, addr in pairs if addr in _addresses_of(ddp.WOLRD_URLS[rank])})
        if ddp.WORLD_RANK not in (0, rank):
            # 0 is what GluonCV's tutorial file says on every node; any other rank is a claim to check.
            raise DistributedError(
                f"DDP_CONFIG.WORLD_RANK is {ddp.WORLD_RANK} but AUTO_RANK_MATCH finds this host at rank {rank} "
                f"({ddp.WOLRD_URLS[rank]} on {', '.join(ifaces)}); fix WORLD_RANK (or leave it 0), or set "
                "AUTO_RANK_MATCH: False"
            )
        log.info("AUTO_RANK_MATCH: node rank %d (%s on %s)", rank, ddp.WOLRD_URLS[rank], ", ".join(ifaces))
        return rank
    listed = ", ".join(f"[{i}] {u}" for i, u in enumerate(ddp.WOLRD_URLS))
    addrs = ", ".join(f"{addr} ({name})" for name, addr in pairs)
    if not matches:
        raise DistributedError(
            f"AUTO_RANK_MATCH: none of DDP_CONFIG.WOLRD_URLS ({listed}) is an address of this host; local addresses: "
            f"{addrs}. Put this node's address in WOLRD_URLS, or set AUTO_RANK_MATCH: False and WORLD_RANK"
        )
    raise DistributedError(
        f"AUTO_RANK_MATCH: WOLRD_URLS entries {matches} ({listed}) are all addresses of this host ({addrs}), so its "
        "rank is ambiguous; list each node once, or set AUTO_RANK_MATCH: False and WORLD_RANK"
    )


def add_launcher_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """``--local_rank`` / ``--local-rank``: what the legacy ``torch.distributed.launch`` passes to each worker."""
    parser.add_argument(
        "--local_rank",
        "--local-rank",
        dest="local_rank",
        type=int,
        default=None,
        help="local worker index on this node, set by the legacy torch.distributed.launch (do not pass it yourself)",
    )
    return parser


def node_plan(cfg: Config) -> Plan:
    """Plan for the spawn and legacy modes: ranks from the config, rendezvous at DIST_URL."""
    ddp = cfg.DDP_CONFIG
    use_cuda = has_gpus()
    return Plan(
        node_rank=resolve_node_rank(ddp),
        num_nodes=ddp.WORLD_SIZE,
        per_node=torch.cuda.device_count() if use_cuda else ddp.CPU_WORKERS,
        backend=ddp.DIST_BACKEND,
        dist_url=ddp.DIST_URL,
        init_method=ddp.DIST_URL,
        timeout_s=ddp.TIMEOUT_SECONDS,
        use_cuda=use_cuda,
        source="config",
    )


def _env_plan(cfg: Config) -> tuple[Plan, int, int, int]:
    """Plan under torchrun: (plan, rank, world size, local rank) from the environment, not the file."""
    env = os.environ
    local_world = int(env.get("LOCAL_WORLD_SIZE", "1"))
    world = int(env["WORLD_SIZE"])
    plan = Plan(
        node_rank=int(env.get("GROUP_RANK", int(env["RANK"]) // local_world)),
        num_nodes=max(1, world // local_world),
        per_node=local_world,
        backend=cfg.DDP_CONFIG.DIST_BACKEND,
        dist_url=f"tcp://{env['MASTER_ADDR']}:{env['MASTER_PORT']}",
        init_method="env://",
        timeout_s=cfg.DDP_CONFIG.TIMEOUT_SECONDS,
        use_cuda=has_gpus(),
        source="torchrun",
    )
    return plan, int(env["RANK"]), world, int(env["LOCAL_RANK"])


def _scontrol(*args: str) -> str:
    """scontrol's output, or a DistributedError with its words (the rank-0 address must never be guessed)."""
    try:
        out = subprocess.run(["scontrol", *args], capture_output=True, text=True, timeout=30, check=False)
    except FileNotFoundError:
        raise DistributedError(
            "this process is a task of srun (SLURM_PROCID is set) but scontrol is not on PATH, so the rank-0 node's "
            "address cannot be found; put Slurm's commands on PATH, or export MASTER_ADDR and MASTER_PORT"
        ) from None
    except subprocess.TimeoutExpired:
        raise DistributedError(f"scontrol {' '.join(args)} did not answer within 30 s") from None
    if out.returncode != 0:
        words = "; ".join(line.strip() for line in out.stderr.splitlines() if line.strip()) or f"exit {out.returncode}"
        raise DistributedError(f"scontrol {' '.join(args)} failed ({words}): cannot find the rank-0 node's address; "
                               "export MASTER_ADDR and MASTER_PORT, or run where Slurm's configuration is readable")
    return out.stdout


def slurm_root_address(nodelist: str) -> str:
    """The address of the first node of a Slurm node list: ``scontrol show hostnames``, then its NodeAddr."""
    hosts = _scontrol("show", "hostnames", nodelist).split()
    if not hosts:
        raise DistributedError(f"scontrol show hostnames {nodelist!r} lists no host")
    found = re.search(r"\bNodeAddr=(\S+)", _scontrol("-o", "show", "node", hosts[0]))
    if found is None:
        raise DistributedError(f"scontrol show node {hosts[0]} gives no NodeAddr")
    return found[1]


def _tasks_per_node(spec: str) -> int:
    """The one task count of every node in SLURM_STEP_TASKS_PER_NODE ('2(x3)'); uneven counts are refused."""
    counts = {int(part.split("(")[0]) for part in spec.split(",") if part}
    if len(counts) != 1:
        raise DistributedError(f"srun started {spec} tasks per node (SLURM_STEP_TASKS_PER_NODE); the trainer needs "
                               "the same number on every node: use --ntasks-per-node")
    return counts.pop()


def _srun_plan(cfg: Config) -> tuple[Plan, int, int, int]:
    """Plan of a task of a plain srun: (plan, rank, world size, local rank), as the module docstring says."""
    env = os.environ
    world = int(env["SLURM_NTASKS"])
    per_node = _tasks_per_node(env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE") or str(world))
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST", "")
    addr = env.get("MASTER_ADDR") or slurm_root_address(nodelist)
    port = int(env.get("MASTER_PORT") or _SLURM_PORT_BASE + int(env.get("SLURM_JOB_ID", "0")) % 10000)
    url = f"tcp://{url_host(addr)}:{port}"
    plan = Plan(
        node_rank=int(env.get("SLURM_NODEID", int(env["SLURM_PROCID"]) // per_node)),
        num_nodes=max(1, world // per_node),
        per_node=per_node,
        backend=cfg.DDP_CONFIG.DIST_BACKEND,
        dist_url=url,
        init_method=url,
        timeout_s=cfg.DDP_CONFIG.TIMEOUT_SECONDS,
        use_cuda=has_gpus(),
        source="srun",
    )
    return plan, int(env["SLURM_PROCID"]), world, int(env["SLURM_LOCALID"])


def launcher_plan(cfg: Config) -> tuple[Plan, int, int, int] | None:
    """(plan, rank, world size, local rank) when a launcher's environment decides the ranks: torchrun's, else srun's."""
    if all(name in os.environ for name in _TORCHRUN_ENV):
        return _env_plan(cfg)
    if all(name in os.environ for name in _SRUN_ENV):
        return _srun_plan(cfg)
    return None


def runtime_cfg(cfg: Config, ctx: DistContext, from_env: bool) -> Config:
    """The config as the worker sees it: GPU_WORLD_SIZE/GPU_WORLD_RANK/GPU (and the node rank) computed, not read."""
    gpu = ctx.device.index if ctx.device.type == "cuda" else ctx.local_rank  # the GPU this process decodes on
    update: dict[str, Any] = {"GPU_WORLD_SIZE": ctx.world_size, "GPU_WORLD_RANK": ctx.rank, "GPU": gpu}
    if not from_env:
        update["WORLD_RANK"] = ctx.node_rank
    return cfg.model_copy(update={"DDP_CONFIG": cfg.DDP_CONFIG.model_copy(update=update)})


def single_process_context(cfg: Config) -> DistContext:
    """The context of a ``DISTRIBUTED: False`` run: rank 0 of 1 on GPU ``DDP_CONFIG.GPU`` if there is one."""
    use_cuda = has_gpus()
    return DistContext(
        rank=0,
        world_size=1,
        local_rank=0,
        local_world_size=1,
        node_rank=0,
        num_nodes=1,
        device=torch.device("cuda", cfg.DDP_CONFIG.GPU) if use_cuda else torch.device("cpu"),
        backend=cfg.DDP_CONFIG.DIST_BACKEND,
        distributed=False,
        dist_url="",
    )
