"""This host's network facts: its interfaces and their addresses (``ip -j addr show``, else the kernel's tables: the
one parser of them), the interface that holds an address, and the one that routes to a rendezvous host."""

from __future__ import annotations

import ipaddress
import itertools
import json
import socket
import subprocess
import urllib.parse
from pathlib import Path


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
    return interface_holding(local)


def interface_holding(address: str | ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    """The local interface that holds ``address``, or None when none does (or its name is unknown: the kernel's
    IPv4 table, read when iproute2 cannot answer, does not name interfaces)."""
    wanted = ipaddress.ip_address(address)
    names = [name for name, addr in interface_addresses() if ipaddress.ip_address(addr) == wanted and name != "?"]
    return names[0] if names else None


def local_addresses() -> list[str]:
    """Every address of every local interface (IPv4 and IPv6), without duplicates."""
    return list(dict.fromkeys(addr for _, addr in interface_addresses()))
