"""Run this node's workers: in this process (one worker, torchrun, srun, a legacy launcher's), or spawned one per
device; pass stop signals on to them, and turn a worker's failure into the launcher's one exception."""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import os
import signal
import socket
import tempfile
import threading
import time
import traceback
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

from trainer.config import Config
from trainer.distributed.context import DistContext, DistributedError, PeerError, Plan
from trainer.distributed.process_group import abort_groups, init_group, leave_group
from trainer.distributed.ranks import launcher_plan, node_plan, runtime_cfg, single_process_context
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
from trainer.node_checks import check_runtime
from trainer.runtime.contract import PARENT_ENV, run_name, thread_budget
from trainer.runtime.host.channel import ProcState
from trainer.runtime.host.network import interface_addresses, route_interface
from trainer.timeline import PROCESS

log = logging.getLogger(__name__)

WorkerFn = Callable[["DistContext", Config], None]
# After a spawned worker fails, its peers get this long to end by themselves (their next collective fails), then
# SIGTERM (which a trainer takes as a stop request: it does not end it at once), then as long again, then SIGKILL.
_PEER_GRACE_S = 5.0


def _fix_run_name(cfg: Config) -> Config:
    # 'use_time' becomes the time once, here, so every worker of this node agrees on the run directory.
    log_cfg = cfg.CONFIG.LOG
    if log_cfg.EXP_NAME != "use_time":
        return cfg
    training = cfg.CONFIG.model_copy(update={"LOG": log_cfg.model_copy(update={"EXP_NAME": run_name()})})
    return cfg.model_copy(update={"CONFIG": training})


def _choose_interface(plan: Plan) -> None:
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
    ctx: DistContext, plan: Plan, worker_fn: WorkerFn, cfg: Config, failure_file: Path | None = None
) -> None:
    PROCESS.set(ProcState.TRAINING, ctx.rank)
    init_group(ctx, plan)
    returned = False
    try:
        worker_fn(ctx, runtime_cfg(cfg, ctx, plan.from_env))
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


def _spawned(local_rank: int, plan: Plan, worker_fn: WorkerFn, cfg: Config, failures: str) -> None:
    PROCESS.mark("imported")  # a spawned worker is a new interpreter: its imports came with its arguments
    gc.freeze()  # as trainer.train.main does: its imports' objects stay out of every collection
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


def _spawn(plan: Plan, worker_fn: WorkerFn, cfg: Config) -> None:
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
    from_launcher = launcher_plan(cfg)
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
    plan = node_plan(cfg)
    _choose_interface(plan)
    if local_rank is not None or plan.per_node == 1:  # one worker here: no need for a child process
        if not 0 <= (local_rank or 0) < plan.per_node:
            raise DistributedError(f"--local-rank {local_rank} is not below the {plan.per_node} workers of this node")
        ctx = plan.context(local_rank or 0)
        with _torchrun_env(ctx):
            _run_worker(ctx, plan, worker_fn, cfg)
    else:
        _spawn(plan, worker_fn, cfg)
