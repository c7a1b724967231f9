"""Can the nodes train together? Run on every node at once (roles/cluster_collective starts it with the training
environment's Python; it imports torch and the standard library, nothing of the trainer):

    python collective_check.py --rank R --names '["node0", ...]' --root-addr IP --port P --addr MY_IP
                               [--iface IFACE] [--backend gloo|nccl] [--megabytes 64] [--iterations 3] [--timeout 60]

In the order a job meets them, each step bounded by --timeout:
1. rendezvous: rank 0 listens on ROOT_ADDR:PORT (torch's TCPStore, as a job's rendezvous does); every other rank
   connects to it (a closed port is "refused", a dropping firewall "timed out").
2. pairs: every rank listens on its cluster address on a port the kernel picks (where gloo and NCCL listen: the
   ephemeral range), publishes it in the store, and connects to every other rank's: the node x node matrix. A pair
   that cannot connect would stall the collective's setup until its timeout, so then no collective is tried.
3. collective: a process group of the backend the jobs use over the cluster interface (GLOO_SOCKET_IFNAME, or
   NCCL_SOCKET_IFNAME "=IFACE" on GPU 0), an all-reduce of --megabytes MiB, timed --iterations times, its sum checked.

Prints one JSON object: this node's name, rank, interface and address, "failed" (the step that failed, or null),
"error" (why), "pairs" ({peer: "ok" or why not}), "missing" (ranks that never reached the rendezvous) and
"bandwidth" (size, seconds, algorithm and bus bandwidth in GB/s: bus = algorithm x 2(n-1)/n, as nccl-tests reports
it). The controller puts every node's object together (filter_plugins/cluster_collective.py) and names the node or
pair that failed. Exit status 0 whatever it found; 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import datetime
import errno
import json
import os
import socket
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

PAIR_TIMEOUT_S = 5.0
RETRY_S = 0.5


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
            "failed": None, "error": "", "pairs": {}, "missing": [], "bandwidth": None}

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
        import torch
        import torch.distributed as dist

        args = self.args
        try:
            device = torch.device("cuda", 0) if args.backend == "nccl" else torch.device("cpu")
            if device.type == "cuda":
                torch.cuda.set_device(device)
            dist.init_process_group(args.backend, store=dist.PrefixStore("collective", store), rank=args.rank,
                                    world_size=self.world, timeout=self.left())
        except Exception as exc:
            return self.fail("collective", f"{args.backend} process group: {reason(exc)}")
        try:
            elements = max(1, args.megabytes * 2**20 // 4)
            tensor = torch.empty(elements, dtype=torch.float32, device=device)
            tensor.fill_(args.rank + 1)
            dist.all_reduce(tensor[:1024])  # connections made, first-call costs paid
            seconds = []
            for _ in range(args.iterations):
                tensor.fill_(args.rank + 1)
                dist.barrier()
                start = time.perf_counter()
                dist.all_reduce(tensor)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                seconds.append(time.perf_counter() - start)
            expected = self.world * (self.world + 1) / 2
            if not bool((tensor == expected).all()):
                return self.fail("collective", f"the all-reduce summed to {tensor[0].item()}, not {expected}")
        except Exception as exc:
            return self.fail("collective", f"{args.backend} all-reduce: {reason(exc)}")
        finally:
            dist.destroy_process_group()
        best = min(seconds)
        size = elements * 4
        algbw = size / best / 1e9
        self.result["bandwidth"] = {"bytes": size, "seconds": round(best, 4), "algbw_gbps": round(algbw, 3),
                                    "busbw_gbps": round(algbw * 2 * (self.world - 1) / self.world, 3)}
        return self.result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--names", required=True, help="JSON list of the node names, in rank order")
    parser.add_argument("--root-addr", required=True, help="rank 0's cluster address (the rendezvous)")
    parser.add_argument("--port", type=int, required=True, help="the rendezvous port on rank 0")
    parser.add_argument("--addr", required=True, help="this node's cluster address")
    parser.add_argument("--iface", default="", help="the cluster interface (default: the one that holds --addr)")
    parser.add_argument("--backend", choices=["gloo", "nccl"], default="gloo")
    parser.add_argument("--megabytes", type=int, default=64)
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds for the whole check")
    check = Check(parser.parse_args())
    try:
        result = check.run()
    except Exception as exc:  # whatever went wrong is this node's finding, in the report with the others'
        result = check.fail("check", reason(exc))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
