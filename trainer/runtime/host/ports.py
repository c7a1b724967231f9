"""Which port the next attempt's rendezvous listens on, if this node becomes its rank 0."""

from __future__ import annotations

import socket


def free_port(ip: str = "127.0.0.1") -> int:
    """A port nothing listens on at ``ip`` (loopback by default) now, the kernel's choice: from its ephemeral range,
    which the cluster's firewall (roles/cluster_firewall) admits only the cluster to. A node offers one in every
    report, and the store binds it within seconds of the hub's decision, before the attempt's collectives open their
    own connections."""
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((ip, 0))
        return int(sock.getsockname()[1])
