"""The tests' rendezvous ports: one nothing listens on now, chosen at random outside the kernel's ephemeral range.

A port found by binding to port 0 comes from the ephemeral range (net.ipv4.ip_local_port_range), the one every
outgoing connection on the machine draws its local port from. The suite runs two workers side by side, whose gloo
meshes, ssh sessions and watches open connections all the time: between the moment a test chooses a port that way and
the moment its store listens on it, one of them may take it, and the store fails with EADDRINUSE. A port outside that
range is never handed out to a connection, so only a process that listens on it by number can take it.
(A node's offer for a restart, trainer.runtime.host.ports, stays in the ephemeral range, which the cluster's firewall
guards; on a node, nothing else opens connections in the moment before the store binds.)
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

LOWEST = 10000  # below it live the well-known and registered services' ports
TRIES = 64
NEXT = 8  # a test may listen on the few ports after the one it was given too (a second group's store)


def candidates() -> range:
    """The larger of the gaps below and above the kernel's ephemeral range, within LOWEST..65535."""
    low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    below, above = range(LOWEST, max(LOWEST, low - NEXT)), range(max(LOWEST, high + 1), 65536 - NEXT)
    return below if len(below) >= len(above) else above


def listenable(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the store binds: a TIME_WAIT does not count
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port() -> int:
    """A loopback port nothing listens on now, at random outside the ephemeral range."""
    pool = candidates()
    port = next((p for p in random.sample(pool, min(TRIES, len(pool))) if listenable(p)), None)
    assert port is not None, f"no free loopback port in {TRIES} tries between {pool.start} and {pool.stop - 1}"
    return port
