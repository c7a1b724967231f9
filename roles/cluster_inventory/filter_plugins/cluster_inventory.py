"""The inventory contract, in one place: every playbook checks the groups `trainers` and `spares` with it before
touching a node, and the job id it acts on.

``cluster_contract`` takes one row per node (the inventory variables the contract covers, as the inventory gives
them, and whether the node is a spare) and returns the normalised cluster every role reads
(``cluster_inventory_layout``) plus a list of errors, each a sentence naming the node and the variable. Rules
(inventory/README.md explains them to users):

- ``cluster_ip`` (default ``ansible_host``, default the inventory name) is an IP address; a DNS name is resolved
  once, here on the controller, and the address is what the cluster uses (``from=`` restrictions, rendezvous);
  a name that does not resolve is refused. Every node has its own address.
- ``node_rank`` is given for every node or for none, as 0..N-1 each once; none means inventory order.
- ``gpus`` is absent (launch-training.yml asks nvidia-smi), a count (0 = CPU node), or a list of distinct device
  ids for CUDA_VISIBLE_DEVICES; its GPU count is the count or the list's length. (That every node of a job has the
  same count is the trainer's rule: `python -m trainer.node_config` checks it with the counts the launch found.)
- a node's inventory name names its folders on every node (``<jobs>/<job id>/<node>``) and its ``~/.ssh/config``
  entry, so it follows the job id's rule (letters, digits, ``.``, ``_``, ``-``; no ``../x``, no space).
- ``ansible_port`` is a TCP port (default 22); node-to-node SSH (known_hosts, the check) uses it too.
- ``ansible_user`` is the same on every node (unset = the controller's user) and not root: the cluster key lets
  every node log in to every other as that user. (The login a connection really gets is checked again on the nodes
  by playbooks/validate-inventory.yml: ``-u root`` passes this rule.)
- spares (the group ``spares``) follow the same rules but have no ``node_rank``: they train only when one replaces
  a lost node. A node is a trainer or a spare, not both.

``job_id`` checks the job id a playbook acts on: ``-e job_id``, else the name of ``-e config`` without .yaml.

Plain functions, so tests import this file directly; ``FilterModule`` only registers them for Ansible.
"""

from __future__ import annotations

import getpass
import ipaddress
import re
import socket
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ansible_collections.vidcluster.launcher.plugins.plugin_utils.trainer import trainer_module

layout = trainer_module("runtime.layout")
JOB_ID_CHARS, valid_job_id = layout.JOB_ID_CHARS, layout.valid_job_id


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _as_int(value: Any) -> int | None:
    """An integer given as a YAML int or as digits (``-e`` extra vars arrive as strings); else None."""
    if _is_int(value):
        return int(value)
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return None


def resolve_address(value: str) -> str:
    """The IP address ``value`` stands for: itself when it is one, else the first address its name resolves to.

    Raises ValueError naming the value when it neither is an address nor resolves."""
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(value, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise ValueError(f"{value!r} is not an IP address and does not resolve ({exc})") from None
    # IPv4 first: the trainer's rendezvous and gloo/nccl interfaces are usually IPv4.
    addresses = sorted({info[4][0] for info in infos}, key=lambda a: (ipaddress.ip_address(a).version, a))
    return addresses[0]


def _is_ip(value: str) -> bool:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True


def _gpus(value: Any) -> tuple[int | None, list[int] | None, str]:
    """(count, device ids or None, error) of an inventory ``gpus`` value (absent: count None)."""
    if value is None:
        return None, None, ""
    if isinstance(value, list | tuple):
        ids = [_as_int(item) for item in value]
        if any(i is None for i in ids) or len(set(ids)) != len(ids):
            return None, None, f"gpus {list(value)!r} is not a list of distinct device ids"
        return len(ids), [int(i) for i in ids if i is not None], ""
    count = _as_int(value)
    if count is None:
        return None, None, f"gpus {value!r} is neither a GPU count nor a list of device ids"
    return count, None, ""


def _port(value: Any) -> int | None:
    port = _as_int(22 if value is None else value)
    return port if port is not None and 0 < port < 65536 else None


def _ranks(rows: Sequence[Mapping[str, Any]], errors: list[str]) -> list[str]:
    """Training node names in rank order: by node_rank when every trainer has one, else inventory order."""
    for row in rows:
        if row.get("spare") and row.get("node_rank") is not None:
            errors.append(f"{row['name']}: node_rank is set on a spare; spares take the rank of the node they replace")
    rows = [row for row in rows if not row.get("spare")]
    names = [str(row["name"]) for row in rows]
    given = {str(row["name"]): row.get("node_rank") for row in rows}
    with_rank = [name for name in names if given[name] is not None]
    if not with_rank:
        return names
    if len(with_rank) != len(names):
        missing = ", ".join(name for name in names if given[name] is None)
        errors.append(f"node_rank is set for some nodes but not for {missing}; set it for every node or for none")
        return names
    ranks = {name: _as_int(given[name]) for name in names}
    if sorted(r if r is not None else -1 for r in ranks.values()) != list(range(len(names))):
        listed = ", ".join(f"{name}={given[name]}" for name in names)
        errors.append(f"node_rank must number the nodes 0..{len(names) - 1}, each once; got {listed}")
        return names
    return sorted(names, key=lambda name: ranks[name] or 0)


def cluster_contract(rows: Sequence[Mapping[str, Any]], controller_user: str = "") -> dict[str, Any]:
    """Check the trainers' inventory rows and normalise them; see the module docstring for the rules.

    Each row: ``{name, ansible_host, cluster_ip, node_rank, gpus, ansible_port, ansible_user, spare}`` (None =
    unset). Returns ``{nodes: {name: node}, order, spares, members, root, user, errors}`` where a node is ``{name,
    rank, spare, ssh_host, port, ip, names, addresses, gpus, devices}``: ``rank`` None for a spare, ``ip`` the
    resolved cluster address, ``names`` every name and address peers may use for it (known_hosts, ssh config),
    ``addresses`` the IP addresses it connects from (authorized_keys from=), ``gpus`` the count or None (ask
    nvidia-smi), ``devices`` the listed ids or None; ``order`` the trainers in rank order, ``spares`` the spares in
    inventory order, ``members`` both.
    """
    errors: list[str] = []
    if not [row for row in rows if not row.get("spare")]:
        return {"nodes": {}, "order": [], "spares": [], "members": [], "root": "", "user": "", "errors": [
            "the inventory has no hosts in the group 'trainers' (see inventory/README.md)"]}
    nodes: dict[str, dict[str, Any]] = {}
    for row in rows:
        name = str(row["name"])
        if not valid_job_id(name):
            errors.append(f"{name!r}: a node's inventory name names its folders on every node and its entry in "
                          f"~/.ssh/config; use {JOB_ID_CHARS}")
        ssh_host = str(row.get("ansible_host") or name)
        given_ip = str(row.get("cluster_ip") or ssh_host)
        try:
            ip = resolve_address(given_ip)
        except ValueError as exc:
            errors.append(f"{name}: cluster_ip (default ansible_host) {exc}; give the node's IP address")
            ip = given_ip
        count, devices, problem = _gpus(row.get("gpus"))
        if problem:
            errors.append(f"{name}: {problem}")
        port = _port(row.get("ansible_port"))
        if port is None:
            errors.append(f"{name}: ansible_port {row.get('ansible_port')!r} is not a TCP port (1-65535)")
        nodes[name] = {"name": name, "spare": bool(row.get("spare")), "rank": None,
                       "ssh_host": ssh_host, "port": port or 22, "ip": ip,
                       "names": list(dict.fromkeys([name, ssh_host, given_ip, ip])),
                       "addresses": list(dict.fromkeys(a for a in (ip, ssh_host) if _is_ip(a))),
                       "gpus": count, "devices": devices}
    by_ip: dict[str, list[str]] = {}
    for node in nodes.values():
        by_ip.setdefault(node["ip"], []).append(node["name"])
    for ip, holders in by_ip.items():
        if len(holders) > 1:
            errors.append(f"cluster address {ip} is used by {', '.join(holders)}; every node needs its own cluster_ip")
    users = {str(row["name"]): str(row.get("ansible_user") or controller_user or getpass.getuser()) for row in rows}
    if len(set(users.values())) > 1:
        listed = ", ".join(f"{name}={user}" for name, user in users.items())
        errors.append(f"ansible_user differs between nodes ({listed}); the cluster runs as one user on every node")
    user = next(iter(users.values()))
    if user == "root":
        errors.append("ansible_user is root; the cluster key would let every node log in to every other as root: "
                      "use an ordinary cluster user (it may have sudo)")
    order = _ranks(rows, errors)
    for rank, name in enumerate(order):
        nodes[name]["rank"] = rank
    spares = [str(row["name"]) for row in rows if row.get("spare")]
    return {"nodes": nodes, "order": order, "spares": spares, "members": order + spares, "root": order[0],
            "user": user, "errors": errors}


def job_id(given: Any, config: Any = "") -> dict[str, str]:
    """``{id, error}``: the job id a playbook acts on (``given``, -e job_id; else the config's file name without
    .yaml; '' when neither is given: every job), or why it cannot be one (it could name another folder, or break a
    command line)."""
    value = str(given) if given not in (None, "") else re.sub(r"\.ya?ml$", "", str(config or "").rstrip("/")
                                                               .rsplit("/", 1)[-1])
    if value and not valid_job_id(value):
        source = "-e job_id" if given not in (None, "") else "the name of -e config"
        return {"id": "", "error": f"job id {value!r} ({source}) names a folder on every node: use {JOB_ID_CHARS}"}
    return {"id": value, "error": ""}


class FilterModule:
    """Registers the functions above as Ansible filters."""

    def filters(self) -> dict[str, Callable[..., Any]]:
        return {"cluster_contract": cluster_contract, "cluster_resolve_address": resolve_address,
                "cluster_job_id": job_id}
