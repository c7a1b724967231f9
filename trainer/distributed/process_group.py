"""Join the process group (bounded by TIMEOUT_SECONDS), leave it, abort it, and join the next attempt's."""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import _abort_process_group

from trainer.config import Config
from trainer.distributed.context import DistContext, PeerError, Plan
from trainer.distributed.ranks import node_plan, runtime_cfg
from trainer.errors import first_line
from trainer.numa import bind_to_gpu
from trainer.runtime.host.channel import ProcState
from trainer.timeline import PROCESS

log = logging.getLogger(__name__)

# A process group that has not formed TIMEOUT_SECONDS + this long after it began to ends its process (_formed_within).
_FORMING_GRACE_S = 5.0


def _attempt_store(ctx: DistContext, plan: Plan) -> dist.Store | None:
    """Under torchrun, the store its agents keep for the workers outlives a restart, and with it every key the last
    attempt's workers wrote, gloo's peer addresses among them: a restarted rank could read a dead peer's address and
    wait on it. Each attempt gets a namespace of its own, which its ranks agree on (``_agree_on_attempt``). None: the
    rendezvous is fresh for every attempt (a store rank 0 hosts), init_method as planned."""
    env = os.environ
    if plan.source != "torchrun" or env.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    store = dist.TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), is_master=False,
                          timeout=datetime.timedelta(seconds=plan.timeout_s))
    run = f"vidcluster/{env.get('TORCHELASTIC_RUN_ID', '')}"
    attempt = _agree_on_attempt(dist.PrefixStore(f"{run}/handshake", store), ctx.rank, ctx.world_size,
                                plan.timeout_s)
    return dist.PrefixStore(f"{run}/attempt/{attempt}", store)


_HANDSHAKE_POLL_S = 0.05


def _agree_on_attempt(store: dist.Store, rank: int, world_size: int, timeout_s: float) -> str:
    """A name for this attempt that every rank of it returns, drawn by its rank 0, in a store that keeps the keys of
    attempts that died.

    Nothing torchrun exports names the attempt for all its ranks: TORCHELASTIC_RESTART_COUNT is each agent's own
    (an agent whose worker failed counts a restart, one restarted because the membership changed does not), and the
    rendezvous round stays in the agents. So: every rank says hello with a nonce drawn now; rank 0 answers each hello
    it reads with its own nonce and the hello's, again whenever a hello changes (the first it read may be a dead
    attempt's); a rank that reads its own nonce in its answer has the name and says it joined; rank 0 goes on once
    every rank has joined under its name. A dead attempt's keys hold nonces no one draws again, so none is taken for
    this attempt's."""
    mine = uuid.uuid4().hex
    deadline = time.monotonic() + timeout_s
    if rank == 0:
        answered: dict[int, str] = {}
        waiting = set(range(1, world_size))
        while waiting:
            for peer in sorted(waiting):
                hello = _read(store, f"hello/{peer}")
                if hello and answered.get(peer) != hello:
                    store.set(f"answer/{peer}", f"{mine} {hello}")
                    answered[peer] = hello
                if _read(store, f"joined/{peer}") == mine:
                    waiting.discard(peer)
            if waiting:  # (every rank joined: go on, whatever the clock says)
                _pause_until(deadline, f"ranks {sorted(waiting)} did not join the attempt")
        return mine
    store.set(f"hello/{rank}", mine)
    while True:
        name, _, hello = _read(store, f"answer/{rank}").partition(" ")
        if hello == mine:
            store.set(f"joined/{rank}", name)
            return name
        _pause_until(deadline, "rank 0 did not answer")


def _read(store: dist.Store, key: str) -> str:
    """The key's value, '' while it has none (no wait)."""
    return store.get(key).decode() if store.check([key]) else ""


def _pause_until(deadline: float, waiting_for: str) -> None:
    if time.monotonic() > deadline:
        raise dist.DistStoreError(f"{waiting_for} in the agents' store")
    time.sleep(_HANDSHAKE_POLL_S)


@contextlib.contextmanager
def _formed_within(ctx: DistContext, plan: Plan) -> Iterator[None]:
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


def init_group(ctx: DistContext, plan: Plan) -> None:
    if ctx.device.type == "cuda":
        torch.cuda.set_device(ctx.device)
        # Before any loader worker starts: they inherit the CPUs of their GPU's socket (trainer.numa).
        log.info("rank %d: %s", ctx.rank, bind_to_gpu(ctx.device.index))
    before = _sockets()
    try:
        with _formed_within(ctx, plan):
            store = _attempt_store(ctx, plan)
            dist.init_process_group(
                backend=plan.backend,
                init_method=None if store is not None else plan.init_method,
                store=store,
                world_size=ctx.world_size,
                rank=ctx.rank,
                timeout=datetime.timedelta(seconds=plan.timeout_s),
            )
            dist.barrier()  # everyone has really arrived before any work starts
        _GROUP_SOCKETS.clear()
        _GROUP_SOCKETS.update(set(_sockets().values()) - set(before.values()))
        PROCESS.mark("group")
    except dist.DistError as exc:  # store/network/backend errors: a peer or the rendezvous host is missing
        raise PeerError(
            f"rank {ctx.rank} of {ctx.world_size}: peers did not all meet at the rendezvous {plan.dist_url} within "
            f"{plan.timeout_s}s ({first_line(exc)}); check that every node was started, that the rank-0 node listens "
            "on that address and port, and that the firewall lets the nodes reach it"
        ) from exc


def leave_group() -> None:
    """Tear down this process's process groups (its job's and any other), if it has any."""
    if dist.is_initialized():
        dist.destroy_process_group()


_ABORTING = threading.Lock()  # the main thread parks while the restart-in-place watch may abort (trainer.inplace)


_GROUP_SOCKETS: set[str] = set()  # the TCP connections the attempt's group opened ("socket:[inode]"), for a gloo abort


def _sockets() -> dict[int, str]:
    """This process's sockets: fd -> "socket:[inode]"."""
    found = {}
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            link = os.readlink(f"/proc/self/fd/{fd}")
            if link.startswith("socket:["):
                found[int(fd)] = link
    return found


def _cut_group_connections() -> int:
    """Shut down the connections the attempt's gloo group opened (its listener stays: gloo's accept thread ends the
    process when its socket fails); returns how many. A collective this process or a peer waits in over one of them
    fails at once."""
    cut = 0
    for fd, link in _sockets().items():
        if link not in _GROUP_SOCKETS:
            continue
        with contextlib.suppress(OSError), socket.socket(fileno=os.dup(fd)) as conn:
            if conn.family in (socket.AF_INET, socket.AF_INET6) and not conn.getsockopt(socket.SOL_SOCKET,
                                                                                        socket.SO_ACCEPTCONN):
                conn.shutdown(socket.SHUT_RDWR)
                cut += 1
    return cut


def abort_groups() -> None:
    """Abort this process's process groups, if it has any, when its peers may be gone: torch 2.14's
    destroy_process_group shuts nccl down gracefully, which waits on a dead peer (pytorch#141510); an abort does not
    wait, and a collective another thread waits in fails. Gloo's abort neither closes its connections nor fails a
    collective in flight, and the group outlives its destroy while DDP's hooks hold it: a rank waiting on a live peer
    that had left the attempt waited out TIMEOUT_SECONDS (with 3 nodes, one lost: both survivors, on the local
    cluster). So under gloo the group's connections are shut down first: the collective fails here and at every peer
    waiting on this rank, at once."""
    with _ABORTING:
        if dist.is_initialized():
            if dist.get_backend() == "gloo":
                log.info("gloo: %d connection(s) of the attempt's group shut down", _cut_group_connections())
            _abort_process_group()


def rejoin(ctx: DistContext, cfg: Config, rank: int, rendezvous: str, world_urls: list[str]
           ) -> tuple[DistContext, Config]:
    """This worker, its old group torn down, in the job's next attempt (restart in place: trainer.inplace): node
    rank ``rank`` at ``rendezvous`` among ``world_urls``, its local index kept; its group formed, and its config as a
    process started for that attempt would see it. The attempt's nodes are ``world_urls``: fewer than the attempt
    before's when the job shrank (an elastic job, trainer.elastic)."""
    ddp = cfg.DDP_CONFIG.model_copy(update={"AUTO_RANK_MATCH": False, "WORLD_RANK": rank, "DIST_URL": rendezvous,
                                            "WOLRD_URLS": list(world_urls), "WORLD_SIZE": len(world_urls)})
    attempt_cfg = cfg.model_copy(update={"DDP_CONFIG": ddp})
    plan = node_plan(attempt_cfg)
    moved = plan.context(ctx.local_rank)
    PROCESS.set(ProcState.TRAINING, moved.rank)
    init_group(moved, plan)
    return moved, runtime_cfg(attempt_cfg, moved, plan.from_env)
