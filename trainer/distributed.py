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
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import ipaddress
import itertools
import json
import logging
import os
import re
import signal
import socket
import subprocess
import tempfile
import threading
import time
import traceback
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.distributed_c10d import _abort_process_group

from trainer.config import Config, DDPConfig, check_runtime
from trainer.errors import (
    STOP_SIGNALS,
    USER_ERROR_EXIT,
    Preempted,
    UserError,
    first_line,
    lost_peer,
    restore_stop_handlers,
)
from trainer.heartbeat import start_heartbeat
from trainer.numa import bind_to_gpu
from trainer.runtime.channel import ProcState
from trainer.runtime.contract import PARENT_ENV, run_name, thread_budget
from trainer.runtime.layout import url_host
from trainer.timeline import PROCESS

log = logging.getLogger(__name__)

T = TypeVar("T")
WorkerFn = Callable[["DistContext", Config], None]
_TORCHRUN_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
_SRUN_ENV = ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_STEP_ID")
_SLURM_PORT_BASE = 15000  # + SLURM_JOB_ID mod 10000: the tasks of one job agree, two jobs on a node rarely clash
# After a spawned worker fails, its peers get this long to end by themselves (their next collective fails), then
# SIGTERM (which a trainer takes as a stop request: it does not end it at once), then as long again, then SIGKILL.
_PEER_GRACE_S = 5.0
# A process group that has not formed TIMEOUT_SECONDS + this long after it began to ends its process (_formed_within).
_FORMING_GRACE_S = 5.0


class DistributedError(UserError, RuntimeError):
    """Ranks cannot be decided from the config (bad input); the message says what to change."""


class PeerError(DistributedError):
    """Peers did not meet, a peer went away, or a worker failed: one line, but not the input's fault, so not its exit
    status: a restart may help (exit status 1)."""

    exit_status = 1


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
class _Plan:
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


# ---------------------------------------------------------------------------------------------------------------------
# Local addresses and AUTO_RANK_MATCH


def interface_addresses() -> list[tuple[str, str]]:
    """(interface, address) for every IPv4 and IPv6 address of every local interface, from ``ip -j addr show``."""
    try:
        out = subprocess.run(["ip", "-j", "addr", "show"], capture_output=True, text=True, check=True, timeout=10)
        links = json.loads(out.stdout)
    except (OSError, subprocess.SubprocessError, ValueError):
        return _proc_addresses()  # no iproute2, or one without JSON output: the kernel's own tables
    pairs = []
    for link in links:
        for info in link.get("addr_info", []):
            if info.get("family") in ("inet", "inet6") and "local" in info:
                pairs.append((link["ifname"], info["local"]))
    return pairs


def _proc_addresses() -> list[tuple[str, str]]:
    """The same from /proc: IPv4 from /proc/net/fib_trie (local routes), IPv6 from /proc/net/if_inet6."""
    pairs: list[tuple[str, str]] = []
    v6 = Path("/proc/net/if_inet6")
    for line in v6.read_text().splitlines() if v6.exists() else []:
        hex_addr, *_, ifname = line.split()
        pairs.append((ifname, str(ipaddress.IPv6Address(bytes.fromhex(hex_addr)))))
    lines = Path("/proc/net/fib_trie").read_text().splitlines()
    seen = set()
    for prev, line in itertools.pairwise(lines):
        # "|-- 10.0.0.5" followed by "/32 host LOCAL" marks an address of this host (the interface is not listed).
        if "/32 host LOCAL" in line and prev.strip().startswith("|--"):
            addr = prev.strip().split()[-1]
            if addr not in seen:
                seen.add(addr)
                pairs.append(("?", addr))
    return pairs


def route_interface(dist_url: str) -> str | None:
    """The local interface this host reaches the rendezvous host of ``dist_url`` through (what the kernel's routes
    choose; a UDP socket's connect sends nothing), or None when the host does not resolve or the interface is unknown.
    For a rendezvous on this host, its loopback or the interface holding that address."""
    host = urllib.parse.urlsplit(dist_url).hostname
    try:
        family, _, _, _, address = socket.getaddrinfo(host, 1, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect(address)
            local = ipaddress.ip_address(probe.getsockname()[0].split("%")[0])
    except (OSError, ValueError, IndexError):
        return None
    names = [name for name, addr in interface_addresses() if ipaddress.ip_address(addr) == local and name != "?"]
    return names[0] if names else None


def local_addresses() -> list[str]:
    """Every address of every local interface (IPv4 and IPv6), without duplicates."""
    return list(dict.fromkeys(addr for _, addr in interface_addresses()))


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


# ---------------------------------------------------------------------------------------------------------------------
# Launching


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


def _use_cuda() -> bool:
    return torch.cuda.is_available() and torch.cuda.device_count() > 0


def _node_plan(cfg: Config) -> _Plan:
    """Plan for the spawn and legacy modes: ranks from the config, rendezvous at DIST_URL."""
    ddp = cfg.DDP_CONFIG
    use_cuda = _use_cuda()
    return _Plan(
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


def _env_plan(cfg: Config) -> tuple[_Plan, int, int, int]:
    """Plan under torchrun: (plan, rank, world size, local rank) from the environment, not the file."""
    env = os.environ
    local_world = int(env.get("LOCAL_WORLD_SIZE", "1"))
    world = int(env["WORLD_SIZE"])
    plan = _Plan(
        node_rank=int(env.get("GROUP_RANK", int(env["RANK"]) // local_world)),
        num_nodes=max(1, world // local_world),
        per_node=local_world,
        backend=cfg.DDP_CONFIG.DIST_BACKEND,
        dist_url=f"tcp://{env['MASTER_ADDR']}:{env['MASTER_PORT']}",
        init_method="env://",
        timeout_s=cfg.DDP_CONFIG.TIMEOUT_SECONDS,
        use_cuda=_use_cuda(),
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


def _srun_plan(cfg: Config) -> tuple[_Plan, int, int, int]:
    """Plan of a task of a plain srun: (plan, rank, world size, local rank), as the module docstring says."""
    env = os.environ
    world = int(env["SLURM_NTASKS"])
    per_node = _tasks_per_node(env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE") or str(world))
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST", "")
    addr = env.get("MASTER_ADDR") or slurm_root_address(nodelist)
    port = int(env.get("MASTER_PORT") or _SLURM_PORT_BASE + int(env.get("SLURM_JOB_ID", "0")) % 10000)
    url = f"tcp://{url_host(addr)}:{port}"
    plan = _Plan(
        node_rank=int(env.get("SLURM_NODEID", int(env["SLURM_PROCID"]) // per_node)),
        num_nodes=max(1, world // per_node),
        per_node=per_node,
        backend=cfg.DDP_CONFIG.DIST_BACKEND,
        dist_url=url,
        init_method=url,
        timeout_s=cfg.DDP_CONFIG.TIMEOUT_SECONDS,
        use_cuda=_use_cuda(),
        source="srun",
    )
    return plan, int(env["SLURM_PROCID"]), world, int(env["SLURM_LOCALID"])


def _launcher_plan(cfg: Config) -> tuple[_Plan, int, int, int] | None:
    """(plan, rank, world size, local rank) when a launcher's environment decides the ranks: torchrun's, else srun's."""
    if all(name in os.environ for name in _TORCHRUN_ENV):
        return _env_plan(cfg)
    if all(name in os.environ for name in _SRUN_ENV):
        return _srun_plan(cfg)
    return None


def _runtime_cfg(cfg: Config, ctx: DistContext, from_env: bool) -> Config:
    """The config as the worker sees it: GPU_WORLD_SIZE/GPU_WORLD_RANK/GPU (and the node rank) computed, not read."""
    gpu = ctx.device.index if ctx.device.type == "cuda" else ctx.local_rank  # the GPU this process decodes on
    update: dict[str, Any] = {"GPU_WORLD_SIZE": ctx.world_size, "GPU_WORLD_RANK": ctx.rank, "GPU": gpu}
    if not from_env:
        update["WORLD_RANK"] = ctx.node_rank
    return cfg.model_copy(update={"DDP_CONFIG": cfg.DDP_CONFIG.model_copy(update=update)})


def _fix_run_name(cfg: Config) -> Config:
    # 'use_time' becomes the time once, here, so every worker of this node agrees on the run directory.
    log_cfg = cfg.CONFIG.LOG
    if log_cfg.EXP_NAME != "use_time":
        return cfg
    training = cfg.CONFIG.model_copy(update={"LOG": log_cfg.model_copy(update={"EXP_NAME": run_name()})})
    return cfg.model_copy(update={"CONFIG": training})


def _choose_interface(plan: _Plan) -> None:
    """Gloo's interface, as the launcher chooses it (the one holding the node's cluster address): the one that routes
    to the rendezvous host, unless the environment names one. Left unset, gloo takes whatever this host's name
    resolves to, which on hosts that share a name (containers, cloned images) is not an address its peers reach."""
    if "GLOO_SOCKET_IFNAME" not in os.environ:
        iface = route_interface(plan.dist_url)
        if iface is not None:
            os.environ["GLOO_SOCKET_IFNAME"] = iface  # spawned workers inherit it
    ifname = os.environ.get("GLOO_SOCKET_IFNAME") or os.environ.get("NCCL_SOCKET_IFNAME")
    log.info(
        "node %d of %d, %d %s worker(s); rendezvous %s (%s); interface %s; local addresses %s",
        plan.node_rank,
        plan.num_nodes,
        plan.per_node,
        "GPU" if plan.use_cuda else "CPU",
        plan.dist_url,
        f"from {plan.source}" if plan.from_env else "DIST_URL",
        ifname or f"not found (peers reach this host as {socket.gethostname()} resolves)",
        ", ".join(f"{a} ({n})" for n, a in interface_addresses()),
    )


def _attempt_store(plan: _Plan) -> dist.Store | None:
    """Under torchrun, the store its agent keeps for the workers outlives a restart, and with it every key the last
    attempt's workers wrote, gloo's peer addresses among them: a restarted rank could read a dead peer's address and
    wait on it. Each attempt gets a namespace of its own (torchrun's restart count). None: the rendezvous is fresh
    for every attempt (a store rank 0 hosts), init_method as planned."""
    env = os.environ
    if plan.source != "torchrun" or env.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    store = dist.TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), is_master=False,
                          timeout=datetime.timedelta(seconds=plan.timeout_s))
    attempt = f"{env.get('TORCHELASTIC_RUN_ID', '')}/{env.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    return dist.PrefixStore(f"vidcluster/attempt/{attempt}", store)


@contextlib.contextmanager
def _formed_within(ctx: DistContext, plan: _Plan) -> Iterator[None]:
    """The process group forms within TIMEOUT_SECONDS, or this process ends with status 1 (a restart may help) a few
    seconds later. Gloo bounds most of its connect by that timeout, and then raises (a PeerError here), but not all of
    it (a pair whose peer died while connecting can wait forever), and a wait in native code raises nothing: the
    watch thread ends the process instead, after the grace that lets the timeout's own error come first."""

    def give_up() -> None:
        log.error("rank %d of %d: the process group did not form within %ds at %s (DDP_CONFIG.TIMEOUT_SECONDS); "
                  "ending this process so that the launcher can start it again", ctx.rank, ctx.world_size,
                  plan.timeout_s, plan.dist_url)
        logging.shutdown()
        os._exit(PeerError.exit_status)

    watch = threading.Timer(plan.timeout_s + _FORMING_GRACE_S, give_up)
    watch.daemon = True
    watch.start()
    try:
        yield
    finally:
        watch.cancel()


def _init_group(ctx: DistContext, plan: _Plan) -> None:
    if ctx.device.type == "cuda":
        torch.cuda.set_device(ctx.device)
        # Before any loader worker starts: they inherit the CPUs of their GPU's socket (trainer.numa).
        log.info("rank %d: %s", ctx.rank, bind_to_gpu(ctx.device.index))
    try:
        with _formed_within(ctx, plan):
            store = _attempt_store(plan)
            dist.init_process_group(
                backend=plan.backend,
                init_method=None if store is not None else plan.init_method,
                store=store,
                world_size=ctx.world_size,
                rank=ctx.rank,
                timeout=datetime.timedelta(seconds=plan.timeout_s),
            )
            dist.barrier()  # everyone has really arrived before any work starts
        PROCESS.mark("group")
    except dist.DistError as exc:  # store/network/backend errors: a peer or the rendezvous host is missing
        raise PeerError(
            f"rank {ctx.rank} of {ctx.world_size}: peers did not all meet at the rendezvous {plan.dist_url} within "
            f"{plan.timeout_s}s ({first_line(exc)}); check that every node was started, that the rank-0 node listens "
            "on that address and port, and that the firewall lets the nodes reach it"
        ) from exc


@contextlib.contextmanager
def _torchrun_env(ctx: DistContext) -> Iterator[None]:
    """While a worker runs, its place in the environment as torchrun exports it (RANK, LOCAL_RANK, WORLD_SIZE,
    LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT): libraries the worker uses read them. Put back after a
    worker that ran in this process, so a later launch here does not take them for torchrun's."""
    url = urllib.parse.urlsplit(ctx.dist_url)
    values = {"RANK": ctx.rank, "LOCAL_RANK": ctx.local_rank, "WORLD_SIZE": ctx.world_size,
              "LOCAL_WORLD_SIZE": ctx.local_world_size, "GROUP_RANK": ctx.node_rank, "MASTER_ADDR": url.hostname,
              "MASTER_PORT": url.port}
    before = {name: os.environ.get(name) for name in values}
    os.environ.update({name: str(value) for name, value in values.items()})
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _run_worker(
    ctx: DistContext, plan: _Plan, worker_fn: WorkerFn, cfg: Config, failure_file: Path | None = None
) -> None:
    PROCESS.set(ProcState.TRAINING, ctx.rank)
    _init_group(ctx, plan)
    returned = False
    try:
        worker_fn(ctx, _runtime_cfg(cfg, ctx, plan.from_env))
        returned = True
    except Preempted:
        raise  # a stop that was asked for, not a failure
    except Exception as exc:
        error = exc
        if lost_peer(exc):  # a consequence: one line here, the rank that stopped first says why
            error = PeerError(f"rank {ctx.rank} of {ctx.world_size} lost its peers in a collective "
                                     f"({first_line(exc)}); the rank that failed first says why")
        if failure_file is not None:
            # Stamped before the teardown below wakes the peers, whose own errors are consequences and come later.
            user = str(error) if isinstance(error, UserError) else None
            status = error.exit_status if isinstance(error, UserError) else 1
            record = {"at": time.monotonic_ns(), "error": traceback.format_exc(), "user": user, "exit": status}
            failure_file.write_text(json.dumps(record))
        if error is exc:
            raise
        raise error from exc
    finally:
        if returned:
            leave_group()
        else:
            abort_groups()


def leave_group() -> None:
    """Tear down this process's process groups (its job's and any other), if it has any."""
    if dist.is_initialized():
        dist.destroy_process_group()


_ABORTING = threading.Lock()  # the main thread parks while the restart-in-place watch may abort (trainer.inplace)


def abort_groups() -> None:
    """Abort this process's process groups, if it has any, when its peers may be gone: torch 2.14's
    destroy_process_group shuts nccl down gracefully, which waits on a dead peer (pytorch#141510); an abort does not
    wait, and a collective another thread waits in fails. On gloo the abort only drops the groups (a collective in
    flight fails when its dead peer's connection closes, not before), and is as quick."""
    with _ABORTING:
        if dist.is_initialized():
            _abort_process_group()


def rejoin(ctx: DistContext, cfg: Config, rank: int, rendezvous: str, world_urls: list[str]
           ) -> tuple[DistContext, Config]:
    """This worker, its old group torn down, in the job's next attempt (restart in place: trainer.inplace): node
    rank ``rank`` at ``rendezvous`` among ``world_urls``, its local index kept; its group formed, and its config as a
    process started for that attempt would see it."""
    ddp = cfg.DDP_CONFIG.model_copy(update={"AUTO_RANK_MATCH": False, "WORLD_RANK": rank, "DIST_URL": rendezvous,
                                            "WOLRD_URLS": list(world_urls)})
    attempt_cfg = cfg.model_copy(update={"DDP_CONFIG": ddp})
    plan = _node_plan(attempt_cfg)
    moved = plan.context(ctx.local_rank)
    PROCESS.set(ProcState.TRAINING, moved.rank)
    _init_group(moved, plan)
    return moved, _runtime_cfg(attempt_cfg, moved, plan.from_env)


def _spawned(local_rank: int, plan: _Plan, worker_fn: WorkerFn, cfg: Config, failures: str) -> None:
    PROCESS.mark("imported")  # a spawned worker is a new interpreter: its imports came with its arguments
    start_heartbeat()
    if not plan.use_cuda and "OMP_NUM_THREADS" not in os.environ:  # a user's setting wins, as under torchrun
        # N CPU workers share the cores; torch would otherwise start one thread per core in each of them.
        torch.set_num_threads(thread_budget(plan.per_node))
    try:
        ctx = plan.context(local_rank)
        with _torchrun_env(ctx):
            _run_worker(ctx, plan, worker_fn, cfg, Path(failures) / str(local_rank))
    except Preempted as exc:
        # The worker ends normally (spawn would kill its peers, which may still be writing their checkpoint copy);
        # the launcher raises Preempted once all have ended.
        (Path(failures) / f"preempted.{local_rank}").write_text(str(exc))


def _first_failure(failures: Path) -> tuple[int, dict[str, Any]] | None:
    """(local index, failure record) of the worker whose own code failed first, if any did."""
    stamped = [(json.loads(f.read_text()), int(f.name)) for f in failures.iterdir() if f.name.isdigit()]
    if not stamped:
        return None
    record, index = min(stamped, key=lambda item: item[0]["at"])
    return index, record


@contextlib.contextmanager
def _passing_on_stop_signals(pids: list[int]) -> Iterator[None]:
    """While the workers run, a stop signal sent to this process reaches each of them (a supervisor may signal
    only the process it started)."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set handlers; nobody signals an embedded launcher
        return

    passed: list[int] = []

    def pass_on(signum: int, _frame: object) -> None:
        passed.append(signum)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    previous = {sig: signal.signal(sig, pass_on) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        restore_stop_handlers(previous, bool(passed))


def _spawn(plan: _Plan, worker_fn: WorkerFn, cfg: Config) -> None:
    # Stopping the peers of a failed worker is how its failure is handled, not news for a warning line.
    logging.getLogger("torch.multiprocessing.spawn").setLevel(logging.ERROR)
    os.environ[PARENT_ENV] = str(os.getpid())  # the workers' parent is this process, not its supervisor
    with tempfile.TemporaryDirectory(prefix="vidcluster-failures-") as failures:
        try:
            workers = mp.start_processes(_spawned, args=(plan, worker_fn, cfg, failures), nprocs=plan.per_node,
                                         join=False, start_method="spawn")
            with _passing_on_stop_signals(workers.pids()):
                while not workers.join(grace_period=_PEER_GRACE_S):
                    pass
        except mp.ProcessRaisedException as exc:
            # spawn names whichever failed worker it notices first, often a peer that lost the one that failed.
            index, record = _first_failure(Path(failures)) or (exc.error_index, {"error": exc.msg, "user": None})
            if record["user"] is not None:
                raise (UserError if record.get("exit") == USER_ERROR_EXIT else PeerError)(record["user"]) from None
            trace = record["error"]
            log.error("local worker %d failed:\n%s", index, trace)
            last = [line for line in trace.strip().splitlines() if line.strip()][-1]
            raise PeerError(f"local worker {index} failed: {last}") from exc
        except mp.ProcessExitedException as exc:
            raise PeerError(f"local worker {exc.error_index} (pid {exc.error_pid}) died: {exc}") from exc
        preempted = sorted(Path(failures).glob("preempted.*"))
        if preempted:
            raise Preempted(preempted[0].read_text())


def single_process_context(cfg: Config) -> DistContext:
    """The context of a ``DISTRIBUTED: False`` run: rank 0 of 1 on GPU ``DDP_CONFIG.GPU`` if there is one."""
    use_cuda = _use_cuda()
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


def launch(worker_fn: WorkerFn, cfg: Config, local_rank: int | None = None) -> None:
    """Run ``worker_fn(ctx, cfg)`` in every process of this node, as the module docstring describes.

    ``worker_fn`` must be importable (a module-level function) when workers are spawned. Returns when all of this
    node's workers have finished; raises DistributedError (or the worker's own exception when it runs in this
    process) when one fails.
    """
    start_heartbeat()
    check_runtime(cfg)
    cfg = _fix_run_name(cfg)
    if not cfg.DDP_CONFIG.DISTRIBUTED:
        ctx = single_process_context(cfg)
        if ctx.device.type == "cuda":  # as a worker does: allocations without a device (a snapshot's copies) go there
            torch.cuda.set_device(ctx.device)
        worker_fn(ctx, cfg)
        return
    from_launcher = _launcher_plan(cfg)
    if from_launcher is not None:
        plan, rank, world, env_local = from_launcher
        if local_rank is not None and local_rank != env_local:
            raise DistributedError(
                f"--local-rank {local_rank} disagrees with LOCAL_RANK={env_local} in the environment"
            )
        _choose_interface(plan)
        ctx = plan.context(env_local, rank, world)
        with _torchrun_env(ctx):  # torchrun exported them already; a task of srun gets them here
            _run_worker(ctx, plan, worker_fn, cfg)
        return
    plan = _node_plan(cfg)
    _choose_interface(plan)
    if local_rank is not None or plan.per_node == 1:  # one worker here: no need for a child process
        if not 0 <= (local_rank or 0) < plan.per_node:
            raise DistributedError(f"--local-rank {local_rank} is not below the {plan.per_node} workers of this node")
        ctx = plan.context(local_rank or 0)
        with _torchrun_env(ctx):
            _run_worker(ctx, plan, worker_fn, cfg)
    else:
        _spawn(plan, worker_fn, cfg)


# ---------------------------------------------------------------------------------------------------------------------
# Collective helpers: each is a no-op (or the identity) when there is no process group


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
