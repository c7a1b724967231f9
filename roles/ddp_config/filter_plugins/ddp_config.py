"""Filters of the ddp_config role: which network interface holds a node's cluster address (from its gathered facts),
and the job description the trainer's renderer reads.

``FilterModule`` registers the plain functions below for Ansible.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Mapping
from typing import Any


def _same(a: Any, b: str) -> bool:
    try:
        return ipaddress.ip_address(str(a).split("%")[0]) == ipaddress.ip_address(b)
    except ValueError:
        return False


def interface_of(facts: Mapping[str, Any], ip: str) -> str:
    """The network interface whose IPv4 or IPv6 addresses include ``ip`` (the node's cluster_ip), or ''."""
    for name in facts.get("interfaces", []):
        device = facts.get(str(name).replace("-", "_")) or {}
        v4 = [device.get("ipv4") or {}, *(device.get("ipv4_secondaries") or [])]
        addresses = [a.get("address") for a in v4] + [a.get("address") for a in device.get("ipv6") or []]
        if any(_same(address, ip) for address in addresses if address):
            return str(device.get("device", name))
    return ""


def node_addresses(facts: Mapping[str, Any]) -> list[str]:
    """Every IPv4 and IPv6 address of a node, for a message that says which addresses it has."""
    return [*facts.get("all_ipv4_addresses", []), *facts.get("all_ipv6_addresses", [])]


class FilterModule:
    """Registers the functions above as Ansible filters."""

    def filters(self) -> dict[str, Callable[..., Any]]:
        return {"ddp_config_interface": interface_of, "ddp_config_addresses": node_addresses}
