"""Can the nodes train together? Run on every node at once (roles/cluster_collective starts it with the training
environment's Python; it imports torch and the standard library, nothing of the trainer):

    python collective_check.py --rank R --names '["node0", ...]' --root-addr IP --port P --addr MY_IP
                               [--iface IFACE] [--backend gloo|nccl] [--gpus '[8, 8, ...]'] [--cpu-ranks 1]
                               [--env '{"NCCL_IB_HCA": "mlx5"}'] [--megabytes 64] [--iterations 3] [--timeout 60]

In the order a job meets them, each step bounded by --timeout:
1. rendezvous: rank 0 listens on ROOT_ADDR:PORT (torch's TCPStore, as a job's rendezvous does); every other rank
   connects to it (a closed port is "refused", a dropping firewall "timed out").
2. pairs: every rank listens on its cluster address on a port the kernel picks (where gloo and NCCL listen: the
   ephemeral range), publishes it in the store, and connects to every other rank's: the node x node matrix. A pair
   that cannot connect would stall the collective's setup until its timeout, so then no collective is tried.
3. collective: a process group of the backend the jobs use over the cluster interface (GLOO_SOCKET_IFNAME, or
   NCCL_SOCKET_IFNAME "=IFACE"), with ranks laid out as a job's (layout(): one per GPU on an nccl node, so NVLink
   carries the node's share and the fabric the rest; --cpu-ranks on a gloo node), the job's NCCL_* variables (--env)
   set, an all-reduce of --megabytes MiB, timed --iterations times, its sum checked. This process is the node's first
   rank; the others are this program again with --local-rank (sys.orig_argv: the same interpreter, flags and code).
   With nccl every rank logs at NCCL_DEBUG=INFO to a file, and the lines that say which transport carries each
   channel ("via NET/IB/0", "via NET/Socket/0", "via P2P/CUMEM") are quoted in the result (transports()).

Prints one JSON object: this node's name, rank, interface and address, "failed" (the step that failed, or null),
"error" (why), "pairs" ({peer: "ok" or why not}), "missing" (ranks that never reached the rendezvous),
"bandwidth" (size, seconds, algorithm and bus bandwidth in GB/s: bus = algorithm x 2(n-1)/n over the n ranks, as
nccl-tests reports it), "ranks" (this node's, and the world's), "env" (the NCCL variables it ran with) and "nccl"
(the network NCCL chose, and a quoted log line per transport; null with gloo). The controller puts every node's object
together (filter_plugins/cluster_collective.py) and names the node or pair that failed, or that is below the floor.
Exit status 0 whatever it found; 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import datetime
import errno
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

PAIR_TIMEOUT_S = 5.0
RETRY_S = 0.5
# The job's variables the check runs with (the rest of a trainer's environment is not the network's).
JOB_ENV_PREFIXES = ("NCCL_", "TORCH_NCCL_")
# NCCL's log for the check, one file per process: INIT and NET say which network NCCL chose and what carries each
# channel. They replace the job's own NCCL_DEBUG settings for the check.
NCCL_LOG = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"}
# "Channel 00/0 : 1[1] -> 2[0] [send] via NET/IB/0/GDRDMA" (older NCCL: "Channel 00 : 0[1b000] -> 1[3d000] via
# P2P/IPC"): the ranks, and what carries the channel between them.
CHANNEL = re.compile(r"Channel \d+(?:/\d+)? : (\d+)\[[0-9a-fA-F]+\] -> (\d+)\[[0-9a-fA-F]+\](?: \[\w+\])? "
                     r"via (\S.*?)\s*$")
NETWORK = re.compile(r"NCCL INFO Using network (\S.*?)\s*$")


def reason(exc: BaseException) -> str:
    """A connection error in the words the report uses."""
    if isinstance(exc, (TimeoutError, socket.timeout)) or getattr(exc, "errno", None) == errno.ETIMEDOUT:
        return "timed out"
    if isinstance(exc, ConnectionRefusedError):
        return "refused"
    if getattr(exc, "errno", None) in (errno.EHOSTUNREACH, errno.ENETUNREACH):
        return "no route"
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def connect_once(addr: str, port: int, timeout: float) -> str:
    """'ok', or why a TCP connection to addr:port could not be made."""
    try:
        with socket.create_connection((addr, port), timeout=timeout):
            return "ok"
    except OSError as exc:
        return reason(exc)


def reach(addr: str, port: int, deadline: float) -> str:
    """Connect until ``deadline`` (the root may start a moment later), at least once: 'ok', or the last reason it
    could not."""
    while True:
        found = connect_once(addr, port, max(1.0, min(PAIR_TIMEOUT_S, deadline - time.monotonic())))
        if found == "ok" or time.monotonic() >= deadline:
            return found
        if found != "timed out":
            time.sleep(RETRY_S)


def layout(gpus: list[int], backend: str, cpu_ranks: int) -> list[int]:
    """Ranks per node, in node order, as a job lays them out: one per GPU with nccl (at least one: a node without a
    GPU then fails naming itself), else ``cpu_ranks`` each."""
    if backend == "nccl":
        return [max(1, count) for count in gpus]
    return [cpu_ranks] * len(gpus)


def job_env(env: dict[str, str]) -> dict[str, str]:
    """The job's NCCL variables out of its environment."""
    return {key: str(value) for key, value in sorted(env.items()) if key.startswith(JOB_ENV_PREFIXES)}


def transport_kind(via: str) -> str:
    """'NET/IB/0/GDRDMA' -> 'NET/IB', 'NET/Socket/1' -> 'NET/Socket', 'P2P/CUMEM/read' -> 'P2P', 'SHM/direct' ->
    'SHM'."""
    parts = via.split("/")
    return "/".join(parts[:2]) if parts[0] == "NET" and len(parts) > 1 else parts[0]


def transports(lines: list[str]) -> dict[str, Any]:
    """What NCCL's INFO log says carries the collective: ``network`` (its "Using network X" choice, or None) and
    ``transports``: {kind: [{"from": rank, "to": rank, "line": the first channel line between them, quoted from
    "Channel"}, ...]}, one entry per pair of ranks in the order met."""
    network = None
    found: dict[str, list[dict[str, Any]]] = {}
    for line in lines:
        if (chosen := NETWORK.search(line)) is not None:
            network = network or chosen.group(1)
        if (channel := CHANNEL.search(line)) is None:
            continue
        links = found.setdefault(transport_kind(channel.group(3)), [])
        src, dst = int(channel.group(1)), int(channel.group(2))
        if not any(link["from"] == src and link["to"] == dst for link in links):
            links.append({"from": src, "to": dst, "line": line[channel.start():].strip()})
    return {"network": network, "transports": found}


def interface_of(addr: str) -> str:
    """The interface that holds ``addr`` (iproute2: ``ip addr show to ADDR``), or ''."""
    try:
        out = subprocess.run(["ip", "-j", "addr", "show", "to", addr], capture_output=True, text=True, timeout=10,
                             check=True).stdout
        return str(json.loads(out or "[]")[0]["ifname"])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError, KeyError):
        return ""


class Listener:
    """A listening socket on this node's cluster address, on a port the kernel picks; accepts and closes."""

    def __init__(self, addr: str, backlog: int) -> None:
        family = socket.AF_INET6 if ":" in addr else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.bind((addr, 0))
        self.sock.listen(backlog)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            conn.close()

    def close(self) -> None:
        self.sock.close()


class Check:
    """This node's run of the three steps; ``result`` is what it prints."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.names: list[str] = json.loads(args.names)
        self.world = len(self.names)
        self.deadline = time.monotonic() + args.timeout
        self.result: dict[str, Any] = {
            "node": self.names[args.rank], "rank": args.rank, "addr": args.addr, "iface": "", "backend": args.backend,
            "failed": None, "error": "", "pairs": {}, "missing": [], "bandwidth": None, "ranks": None, "env": {},
            "nccl": None}

    def fail(self, step: str, error: str) -> dict[str, Any]:
        self.result.update(failed=step, error=error)
        return self.result

    def left(self) -> datetime.timedelta:
        return datetime.timedelta(seconds=max(1.0, self.deadline - time.monotonic()))

    def run(self) -> dict[str, Any]:
        import torch.distributed as dist

        args = self.args
        iface = args.iface or interface_of(args.addr)
        if not iface:
            return self.fail("interface", f"no network interface of {self.result['node']} holds {args.addr}")
        self.result["iface"] = iface
        os.environ.setdefault("GLOO_SOCKET_IFNAME", iface)
        os.environ.setdefault("NCCL_SOCKET_IFNAME", f"={iface}")
        root = self.names[0]
        if args.rank != 0:
            found = reach(args.root_addr, args.port, self.deadline)
            if found != "ok":
                return self.fail("rendezvous", f"cannot reach {root}'s rendezvous {args.root_addr}:{args.port}: "
                                 f"{found}")
        try:
            store = dist.TCPStore(args.root_addr, args.port, self.world, args.rank == 0, timeout=self.left(),
                                  wait_for_workers=False)
        except Exception as exc:  # the port taken on the root, or the root gone since
            where = "listen on" if args.rank == 0 else "join"
            return self.fail("rendezvous", f"cannot {where} {root}'s rendezvous {args.root_addr}:{args.port}: "
                             f"{reason(exc)}")
        try:
            listener = Listener(args.addr, self.world)
        except OSError as exc:
            return self.fail("pairs", f"cannot listen on {args.addr}: {reason(exc)}")
        try:
            return self.pairs_then_collective(store, listener)
        finally:
            listener.close()
            self.leave(store)

    def leave(self, store: Any) -> None:
        """Say this rank is done; rank 0, whose process holds the store, waits for the others to say so before it
        ends (a peer still reading the store would lose it), as long as the check's time allows."""
        try:
            store.set(f"done/{self.args.rank}", "1")
            if self.args.rank == 0:
                store.wait([f"done/{rank}" for rank in range(self.world)], self.left())
        except Exception:  # a peer that never arrived: its own report says why
            pass

    def everyone(self, store: Any, prefix: str) -> dict[int, str] | None:
        """Every rank's value under ``prefix``, or None after recording who never published one."""
        keys = [f"{prefix}/{rank}" for rank in range(self.world)]
        try:
            store.wait(keys, self.left())
        except Exception:  # somebody never came: name them
            self.result["missing"] = [self.names[r] for r, key in enumerate(keys) if not store.check([key])]
            return None
        return {rank: store.get(key).decode() for rank, key in enumerate(keys)}

    def pairs_then_collective(self, store: Any, listener: Listener) -> dict[str, Any]:
        store.set(f"listen/{self.args.rank}", json.dumps([self.args.addr, listener.port]))
        listening = self.everyone(store, "listen")
        if listening is None:
            return self.fail("rendezvous", f"never reached the rendezvous: {', '.join(self.result['missing'])}")
        peers = {self.names[r]: json.loads(value) for r, value in listening.items() if r != self.args.rank}
        with ThreadPoolExecutor(max_workers=min(32, max(1, len(peers)))) as pool:
            probes = {name: pool.submit(connect_once, addr, port, PAIR_TIMEOUT_S) for name, (addr, port) in
                      peers.items()}
            self.result["pairs"] = {name: probe.result() for name, probe in probes.items()}
        store.set(f"pairs/{self.args.rank}", json.dumps(self.result["pairs"]))
        matrix = self.everyone(store, "pairs")
        if matrix is None:
            return self.fail("pairs", f"no pair results from {', '.join(self.result['missing'])}")
        broken = [f"{self.names[r]} -> {peer}" for r, value in matrix.items()
                  for peer, found in json.loads(value).items() if found != "ok"]
        if broken:  # every rank sees the same matrix, so all of them stop here
            return self.fail("pairs", f"pairs that cannot connect: {', '.join(broken)}")
        return self.collective(store)

    def collective(self, store: Any) -> dict[str, Any]:
        args = self.args
        counts = layout(json.loads(args.gpus) if args.gpus else [1] * self.world, args.backend, args.cpu_ranks)
        first, world = sum(counts[:args.rank]), sum(counts)
        self.result["ranks"] = {"first": first, "count": counts[args.rank], "world": world}
        self.result["env"] = job_env(json.loads(args.env))
        with tempfile.TemporaryDirectory(prefix="vidcluster-collective-") as logs:
            os.environ.update(self.rank_env(logs))
            # The node's other ranks: this program again (same interpreter, flags and code), each told its local rank.
            program = [sys.executable, *sys.orig_argv[1:len(sys.orig_argv) - len(sys.argv) + 1]]
            others = [subprocess.Popen([*program, *sys.argv[1:], "--local-rank", str(local)], stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True) for local in range(1, counts[args.rank])]
            try:
                seconds = all_reduce(args, store, first, world, 0, self.left())
            except Exception as exc:
                return self.fail("collective", f"{args.backend} rank {first} (local 0): {reason(exc)}")
            finally:
                errors = [error for error in (finish_rank(proc, first + local, local, self.left())
                                              for local, proc in enumerate(others, start=1)) if error]
                if args.backend == "nccl":
                    self.result["nccl"] = transports(nccl_lines(logs))
            if errors:
                return self.fail("collective", "; ".join(errors))
        size = max(1, args.megabytes * 2**20 // 4) * 4
        algbw = size / seconds / 1e9
        self.result["bandwidth"] = {"bytes": size, "seconds": round(seconds, 4), "algbw_gbps": round(algbw, 3),
                                    "busbw_gbps": round(algbw * 2 * (world - 1) / max(1, world), 3)}
        return self.result

    def rank_env(self, logs: str) -> dict[str, str]:
        """The environment of this node's ranks: the cluster interface, the job's NCCL variables over it (as the job
        sets them, last), and the check's own NCCL log."""
        iface = self.result["iface"]
        env = {"GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME") or iface,
               "NCCL_SOCKET_IFNAME": os.environ.get("NCCL_SOCKET_IFNAME") or f"={iface}",
               "CUDA_DEVICE_ORDER": "PCI_BUS_ID", **self.result["env"]}
        if self.args.backend == "nccl":
            env.update(NCCL_LOG, NCCL_DEBUG_FILE=os.path.join(logs, "nccl.%h.%p.log"))
        return env


def all_reduce(args: argparse.Namespace, store: Any, rank: int, world: int, local: int,
               timeout: datetime.timedelta) -> float:
    """Rank ``rank`` of ``world`` (GPU ``local`` with nccl) in the all-reduce: the fastest of --iterations, seconds.
    Raises what went wrong."""
    import torch
    import torch.distributed as dist

    device = torch.device("cuda", local) if args.backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(args.backend, store=dist.PrefixStore("collective", store), rank=rank, world_size=world,
                            timeout=timeout)
    try:
        tensor = torch.empty(max(1, args.megabytes * 2**20 // 4), dtype=torch.float32, device=device)
        tensor.fill_(rank + 1)
        dist.all_reduce(tensor[:1024])  # connections made, first-call costs paid
        seconds = []
        for _ in range(args.iterations):
            tensor.fill_(rank + 1)
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(tensor)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            seconds.append(time.perf_counter() - start)
        expected = world * (world + 1) / 2
        if not bool((tensor == expected).all()):
            raise ValueError(f"the all-reduce summed to {tensor[0].item()}, not {expected}")
    finally:
        dist.destroy_process_group()
    return min(seconds)


def finish_rank(proc: subprocess.Popen[str], rank: int, local: int, timeout: datetime.timedelta) -> str:
    """'' when the node's rank ``local`` ended its all-reduce, else why not."""
    try:
        out, err = proc.communicate(timeout=timeout.total_seconds() + 5)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    try:
        return str(json.loads(out.strip().splitlines()[-1])["error"])
    except (ValueError, IndexError, KeyError, TypeError):
        last = (err.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        return f"rank {rank} (local {local}) did not finish: {last}"


def nccl_lines(logs: str) -> list[str]:
    lines: list[str] = []
    for name in sorted(os.listdir(logs)):
        with open(os.path.join(logs, name), encoding="utf-8", errors="replace") as log:
            lines += log.read().splitlines()
    return lines


def worker(args: argparse.Namespace) -> None:
    """A node's rank after its first (--local-rank L): the rendezvous as a client, the all-reduce; prints
    {"error": ""} or why it failed."""
    import torch.distributed as dist

    counts = layout(json.loads(args.gpus) if args.gpus else [1] * len(json.loads(args.names)), args.backend,
                    args.cpu_ranks)
    rank, world = sum(counts[:args.rank]) + args.local_rank, sum(counts)
    timeout = datetime.timedelta(seconds=args.timeout)
    try:
        store = dist.TCPStore(args.root_addr, args.port, None, False, timeout=timeout)
        all_reduce(args, store, rank, world, args.local_rank, timeout)
        error = ""
    except Exception as exc:
        error = f"{args.backend} rank {rank} (local {args.local_rank}): {reason(exc)}"
    print(json.dumps({"error": error}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--names", required=True, help="JSON list of the node names, in rank order")
    parser.add_argument("--root-addr", required=True, help="rank 0's cluster address (the rendezvous)")
    parser.add_argument("--port", type=int, required=True, help="the rendezvous port on rank 0")
    parser.add_argument("--addr", required=True, help="this node's cluster address")
    parser.add_argument("--iface", default="", help="the cluster interface (default: the one that holds --addr)")
    parser.add_argument("--backend", choices=["gloo", "nccl"], default="gloo")
    parser.add_argument("--gpus", default="", help="JSON list of every node's GPU count, in rank order")
    parser.add_argument("--cpu-ranks", type=int, default=1, help="ranks per node with gloo")
    parser.add_argument("--env", default="{}", help="JSON object: the job's environment (its NCCL_* are used)")
    parser.add_argument("--local-rank", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--megabytes", type=int, default=64)
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds for the whole check")
    args = parser.parse_args()
    if args.local_rank > 0:
        worker(args)
        return
    check = Check(args)
    try:
        result = check.run()
    except Exception as exc:  # whatever went wrong is this node's finding, in the report with the others'
        result = check.fail("check", reason(exc))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
