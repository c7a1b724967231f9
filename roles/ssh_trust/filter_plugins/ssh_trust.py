"""Filter of the ssh_trust role: the cluster's known_hosts block, every node's host keys under every name and address
peers may use for it, rendered once on the controller (one line per node and key type, linear in the nodes).

``FilterModule`` registers the plain functions below for Ansible.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

KEY_TYPES = ("ed25519", "ecdsa", "rsa")
# Each line ends with this comment naming its node, so a later run (--limit) can keep the lines of the nodes it
# does not gather.
TAG = "vidcluster-node:"


def host_keys(facts: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(key type, base64 key) of every host key in a node's gathered facts (``ansible_facts``)."""
    found = []
    for algo in KEY_TYPES:
        key = facts.get(f"ssh_host_key_{algo}_public")
        if key:
            found.append((str(facts.get(f"ssh_host_key_{algo}_public_keytype") or f"ssh-{algo}"), str(key)))
    return found


def patterns(node: Mapping[str, Any]) -> str:
    """The node's names and addresses as known_hosts host patterns ("[name]:port" off port 22)."""
    port = int(node.get("port") or 22)
    names = node["names"]
    return ",".join(names if port == 22 else (f"[{name}]:{port}" for name in names))


def known_hosts_block(layout: Mapping[str, Any], facts: Mapping[str, Mapping[str, Any]], previous: str = "") -> dict:
    """``{block, missing}``: known_hosts lines for every node of the layout (trainers in rank order, then spares).

    ``facts`` holds the gathered facts of this play's nodes; a node outside the play (``--limit``) keeps its lines
    from ``previous`` (the block the controller wrote last time). ``missing`` lists nodes with neither.
    """
    kept: dict[str, list[str]] = {}
    for line in previous.splitlines():
        if TAG in line:
            kept.setdefault(line.rsplit(TAG, 1)[1].strip(), []).append(line)
    lines, missing = [], []
    for name in layout["members"]:
        node = layout["nodes"][name]
        keys = host_keys(facts.get(name) or {})
        if keys:
            lines += [f"{patterns(node)} {kind} {key} {TAG}{name}" for kind, key in keys]
        elif name in kept:
            # The node was not in this play: its keys as last seen, under the names it has now.
            lines += [f"{patterns(node)} {' '.join(line.split()[1:3])} {TAG}{name}" for line in kept[name]]
        else:
            missing.append(name)
    return {"block": "\n".join(lines), "missing": missing}


class FilterModule:
    """Registers the functions above as Ansible filters."""

    def filters(self) -> dict[str, Callable[..., Any]]:
        return {"ssh_trust_known_hosts_block": known_hosts_block}
