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
- ``vidcluster_min_nodes`` (a group variable: the same on every node), when set, is an integer from 1 to the number
  of trainers: the fewest nodes a job trains on once a lost node no spare can replace leaves the world
  (trainer/runtime/job/policy.py); unset, every trainer (a job never shrinks).

``scheduler_contract`` decides how jobs reach the nodes, from every host of the groups ``trainers``, ``spares`` and
``slurm_submit``: ``vidcluster_scheduler`` is ``ssh`` (the default: the playbooks reach each node over SSH) or
``slurm`` (a Slurm site: the playbooks reach only the login host(s) of ``slurm_submit``, and jobs get their compute
nodes from Slurm), the same on every host. Under ``slurm``:

- ``slurm_submit`` has at least one host; ``trainers`` and ``spares`` have none (the allocation picks the nodes);
- ``vidcluster_slurm_nodes`` (nodes that train, >= 1) and ``vidcluster_slurm_gpus_per_node`` (>= 0; 0 = CPU nodes,
  gloo) are given; ``vidcluster_slurm_spares`` (nodes allocated beyond them, idle until one replaces a lost node),
  ``vidcluster_slurm_partition``, ``vidcluster_slurm_account``, ``vidcluster_slurm_time`` (a Slurm time limit:
  minutes, M:S, H:M:S, D-H, D-H:M or D-H:M:S; empty = the partition's), ``vidcluster_slurm_signal_seconds`` (how long
  before the time limit every rank checkpoints, less than the limit), ``vidcluster_slurm_cpus_per_task`` (``all``, the
  default: whole nodes, ``--exclusive``; or a number of CPUs for each node's one task, which runs all its trainers and
  their loaders), ``vidcluster_slurm_mem`` (``--mem`` per node: ``0``, the default, is all of a node's memory; a
  Slurm size; empty = the site's default), ``vidcluster_slurm_gpus_per_task`` (true: the node's GPUs asked as
  ``--gpus-per-task`` instead of ``--gres``, where the site wants that), ``vidcluster_slurm_gpu_bind`` (a
  ``--gpu-bind`` value, empty = none asked) and ``vidcluster_slurm_sbatch_extra`` (more ``#SBATCH`` options, one per
  item, none of those the launch or a setting owns) may be;
- every ``vidcluster_slurm_*`` variable is one of these, and the same on every login host;
- ``vidcluster_min_nodes`` follows the rule above with ``vidcluster_slurm_nodes`` trainers.

Under ``ssh`` no host is in ``slurm_submit`` and no ``vidcluster_slurm_*`` variable is set: a setting is honoured or
refused by name, never ignored.

``job_id`` checks the job id a playbook acts on: ``-e job_id``, else the name of ``-e config`` without .yaml.

``held_out`` reads the nodes playbooks/check-cluster.yml -e act=true held out of the launches (a file on the
controller, not the inventory: that is the user's) and names each one the inventory does not have.

Plain functions, so tests import this file directly; ``FilterModule`` only registers them for Ansible.
"""

from __future__ import annotations

import getpass
import ipaddress
import json
import re
import socket
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ansible_collections.vidcluster.launcher.plugins.plugin_utils.trainer import trainer_module

LAYOUT = "runtime.layout"  # trainer/runtime/layout.py: what a job id may be


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


def _min_nodes(rows: Sequence[Mapping[str, Any]], trainers: int, errors: list[str]) -> int | None:
    """vidcluster_min_nodes as the rows give it, checked: an integer 1..``trainers``, or None (unset)."""
    given = {str(row["name"]): row.get("min_nodes") for row in rows}
    if len({json.dumps(value) for value in given.values()}) > 1:
        listed = ", ".join(f"{name}={value}" for name, value in given.items())
        errors.append(f"vidcluster_min_nodes differs between nodes ({listed}); it is the job's: set it once for the "
                      "group cluster")
        return None
    value = next(iter(given.values()))
    if value is None:
        return None
    number = int(value) if _is_int(value) or (isinstance(value, str) and re.fullmatch(r"\s*-?\d+\s*", value)) else None
    if number is None:
        errors.append(f"vidcluster_min_nodes {value!r} is not an integer (the fewest nodes a job trains on, 1 to "
                      f"the {trainers} trainers)")
    elif number < 1:
        errors.append(f"vidcluster_min_nodes {number} is below 1 (the fewest nodes a job trains on)")
    elif number > trainers:
        errors.append(f"vidcluster_min_nodes {number} is above the number of trainers ({trainers}): a job cannot "
                      "train on more nodes than it has")
    else:
        return number
    return None


def cluster_contract(rows: Sequence[Mapping[str, Any]], controller_user: str = "") -> dict[str, Any]:
    """Check the trainers' inventory rows and normalise them; see the module docstring for the rules.

    Each row: ``{name, ansible_host, cluster_ip, node_rank, gpus, ansible_port, ansible_user, min_nodes, spare}``
    (None = unset). Returns ``{nodes: {name: node}, order, spares, members, root, user, min_nodes, errors}``
    (``min_nodes`` None: every trainer) where a node is ``{name,
    rank, spare, ssh_host, port, ip, names, addresses, gpus, devices}``: ``rank`` None for a spare, ``ip`` the
    resolved cluster address, ``names`` every name and address peers may use for it (known_hosts, ssh config),
    ``addresses`` the IP addresses it connects from (authorized_keys from=), ``gpus`` the count or None (ask
    nvidia-smi), ``devices`` the listed ids or None; ``order`` the trainers in rank order, ``spares`` the spares in
    inventory order, ``members`` both.
    """
    errors: list[str] = []
    if not [row for row in rows if not row.get("spare")]:
        return {"nodes": {}, "order": [], "spares": [], "members": [], "root": "", "user": "", "min_nodes": None,
                "errors": [
            "the inventory has no hosts in the group 'trainers' (see inventory/README.md)"]}
    layout = trainer_module(LAYOUT)
    nodes: dict[str, dict[str, Any]] = {}
    for row in rows:
        name = str(row["name"])
        if not layout.valid_job_id(name):
            errors.append(f"{name!r}: a node's inventory name names its folders on every node and its entry in "
                          f"~/.ssh/config; use {layout.JOB_ID_CHARS}")
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
            "user": user, "min_nodes": _min_nodes(rows, len(order), errors), "errors": errors}


SCHEDULERS = ("ssh", "slurm")
SLURM_DEFAULTS: dict[str, Any] = {
    "vidcluster_slurm_nodes": None, "vidcluster_slurm_gpus_per_node": None, "vidcluster_slurm_spares": 0,
    "vidcluster_slurm_partition": "", "vidcluster_slurm_account": "", "vidcluster_slurm_time": "",
    "vidcluster_slurm_signal_seconds": 300, "vidcluster_slurm_sbatch_extra": [],
    "vidcluster_slurm_cpus_per_task": "all", "vidcluster_slurm_mem": "0", "vidcluster_slurm_gpus_per_task": False,
    "vidcluster_slurm_gpu_bind": "",
}
# sbatch options the launch sets itself, and the setting (or reason) that owns each.
SBATCH_OWNED = {
    **dict.fromkeys(("--nodes", "-N"), "vidcluster_slurm_nodes and vidcluster_slurm_spares"),
    **dict.fromkeys(("--partition", "-p"), "vidcluster_slurm_partition"),
    **dict.fromkeys(("--account", "-A"), "vidcluster_slurm_account"),
    **dict.fromkeys(("--time", "-t"), "vidcluster_slurm_time"),
    **dict.fromkeys(("--gres", "--gpus-per-node", "--gpus", "-G", "--gpus-per-task"), "vidcluster_slurm_gpus_per_node"),
    **dict.fromkeys(("--cpus-per-task", "-c", "--exclusive", "--cpus-per-gpu"), "vidcluster_slurm_cpus_per_task"),
    **dict.fromkeys(("--mem", "--mem-per-cpu", "--mem-per-gpu"), "vidcluster_slurm_mem"),
    "--gpu-bind": "vidcluster_slurm_gpu_bind",
    "--signal": "vidcluster_slurm_signal_seconds",
    **dict.fromkeys(("--ntasks", "-n", "--ntasks-per-node", "--requeue", "--no-requeue", "--no-kill", "-k",
                     "--output", "-o", "--error", "-e", "--open-mode", "--job-name", "-J", "--chdir", "-D",
                     "--array", "-a", "--wait", "-W", "--parsable", "--export"), "the launch itself"),
}
_TOKEN = re.compile(r"[A-Za-z0-9_.:,+%@-]+")
_SLURM_MEM = re.compile(r"\d+[KMGT]?")  # sbatch --mem: a size, megabytes without a unit
_SLURM_TIME = re.compile(r"(?:(\d+)-(\d+)(?::(\d+)(?::(\d+))?)?|(\d+)(?::(\d+)(?::(\d+))?)?)")


def slurm_time_seconds(text: str) -> int | None:
    """Seconds of a Slurm time limit (minutes, M:S, H:M:S, D-H, D-H:M, D-H:M:S), None when it is not one."""
    match = _SLURM_TIME.fullmatch(text)
    if match is None:
        return None
    days, hours, minutes, seconds, alone, after, last = (int(g) if g else 0 for g in match.groups())
    if match[1] is not None:
        return ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    if match[7] is not None:  # H:M:S
        return (alone * 60 + after) * 60 + last
    return alone * 60 + after  # minutes, or minutes:seconds


def _slurm_settings(given: Mapping[str, Any], errors: list[str]) -> dict[str, Any]:
    """The checked Slurm settings (``SLURM_DEFAULTS`` keys without their prefix); each problem an error naming it."""
    settings = {**SLURM_DEFAULTS, **given}
    checked: dict[str, Any] = {}
    for key, minimum in (("vidcluster_slurm_nodes", 1), ("vidcluster_slurm_gpus_per_node", 0),
                         ("vidcluster_slurm_spares", 0), ("vidcluster_slurm_signal_seconds", 1)):
        value = _as_int(settings[key])
        if settings[key] is None:
            errors.append(f"{key} is not set; a Slurm site needs it (inventory/README.md)")
        elif value is None or value < minimum:
            errors.append(f"{key} {settings[key]!r} is not a whole number >= {minimum}")
        checked[key] = value
    for key in ("vidcluster_slurm_partition", "vidcluster_slurm_account"):
        value = str(settings[key] or "")
        if value and not _TOKEN.fullmatch(value):
            errors.append(f"{key} {value!r} is not a Slurm name (letters, digits and _.:,+%@-)")
        checked[key] = value
    time_limit = str(settings["vidcluster_slurm_time"] or "")
    limit_s = slurm_time_seconds(time_limit) if time_limit else None
    if time_limit and limit_s is None:
        errors.append(f"vidcluster_slurm_time {time_limit!r} is not a Slurm time limit (minutes, M:S, H:M:S, D-H, "
                      "D-H:M or D-H:M:S)")
    signal_s = checked["vidcluster_slurm_signal_seconds"]
    if limit_s is not None and signal_s is not None and signal_s >= limit_s:
        errors.append(f"vidcluster_slurm_signal_seconds {signal_s} is not less than the time limit "
                      f"({time_limit} = {limit_s} s): the checkpoint signal would come before the job starts")
    checked["vidcluster_slurm_time"] = time_limit
    extra = settings["vidcluster_slurm_sbatch_extra"]
    if not isinstance(extra, list) or not all(isinstance(item, str) for item in extra):
        errors.append(f"vidcluster_slurm_sbatch_extra {extra!r} is not a list of sbatch options")
        extra = []
    for item in extra:
        name = re.split(r"[=\s]", item.strip(), maxsplit=1)[0]
        if not name.startswith("-") or "\n" in item or "\r" in item:
            errors.append(f"vidcluster_slurm_sbatch_extra item {item!r} is not one sbatch option (--name[=value])")
        elif name in SBATCH_OWNED:
            errors.append(f"vidcluster_slurm_sbatch_extra item {item!r}: {name} is set by {SBATCH_OWNED[name]}")
    checked["vidcluster_slurm_sbatch_extra"] = [item.strip() for item in extra]
    checked.update(_slurm_resources(settings, checked["vidcluster_slurm_gpus_per_node"], errors))
    settings = {key.removeprefix("vidcluster_slurm_"): value for key, value in checked.items()}
    return {**settings, "site_options": site_options(settings)}


def _slurm_resources(settings: Mapping[str, Any], gpus: int | None, errors: list[str]) -> dict[str, Any]:
    """The checked CPU, memory and GPU-binding settings of a node's one task (which runs every trainer of the node and
    their loaders, so by default it gets the whole node)."""
    cpus = settings["vidcluster_slurm_cpus_per_task"]
    if cpus != "all":
        cpus = _as_int(cpus)
        if cpus is None or cpus < 1:
            errors.append(f"vidcluster_slurm_cpus_per_task {settings['vidcluster_slurm_cpus_per_task']!r} is not 'all' "
                          "(whole nodes) or a whole number >= 1")
    mem = str(settings["vidcluster_slurm_mem"] if settings["vidcluster_slurm_mem"] is not None else "")
    if mem and not _SLURM_MEM.fullmatch(mem):
        errors.append(f"vidcluster_slurm_mem {mem!r} is not a Slurm memory size (0 = all of a node's, 500G, 64000M)")
    per_task = settings["vidcluster_slurm_gpus_per_task"]
    if isinstance(per_task, str) and per_task.strip().lower() in ("true", "false"):  # -e key=value gives text
        per_task = per_task.strip().lower() == "true"
    if not isinstance(per_task, bool):
        errors.append(f"vidcluster_slurm_gpus_per_task {per_task!r} is not true or false")
    elif per_task and not gpus:
        errors.append("vidcluster_slurm_gpus_per_task is true but vidcluster_slurm_gpus_per_node asks no GPU")
    bind = str(settings["vidcluster_slurm_gpu_bind"] or "")
    if bind and not _TOKEN.fullmatch(bind):
        errors.append(f"vidcluster_slurm_gpu_bind {bind!r} is not one --gpu-bind value (none, closest, map_gpu:0,1...)")
    return {"vidcluster_slurm_cpus_per_task": cpus, "vidcluster_slurm_mem": mem,
            "vidcluster_slurm_gpus_per_task": per_task is True, "vidcluster_slurm_gpu_bind": bind}


def site_options(settings: Mapping[str, Any]) -> list[str]:
    """The sbatch/srun options every job of the site gets (where, on what, and the site's own extras): partition,
    account, the node's GPUs (one GPU resource, or the one task's GPUs), the CPUs and memory of the node's one task
    (whole nodes by default: it runs every trainer of the node and their loaders), then the extra options."""
    options = [f"--partition={settings['partition']}"] if settings["partition"] else []
    options += [f"--account={settings['account']}"] if settings["account"] else []
    if settings["gpus_per_node"]:
        gpus = "--gpus-per-task={}" if settings["gpus_per_task"] else "--gres=gpu:{}"
        options.append(gpus.format(settings["gpus_per_node"]))
    options += [f"--gpu-bind={settings['gpu_bind']}"] if settings["gpu_bind"] else []
    cpus = settings["cpus_per_task"]
    options.append("--exclusive" if cpus == "all" else f"--cpus-per-task={cpus}")
    options += [f"--mem={settings['mem']}"] if settings["mem"] else []
    return options + list(settings["sbatch_extra"])


def scheduler_contract(rows: Sequence[Mapping[str, Any]], controller_user: str = "") -> dict[str, Any]:
    """How jobs reach the nodes (see the module docstring): ``{scheduler, submit, user, slurm, errors}``.

    Each row: ``{name, group ('trainers', 'spares' or 'slurm_submit'), scheduler (vidcluster_scheduler or None),
    user (ansible_user or None), min_nodes (vidcluster_min_nodes or None), slurm: {every vidcluster_slurm_* variable
    the host has: value}}``; under slurm ``min_nodes`` is checked against ``vidcluster_slurm_nodes``. ``slurm`` holds
    the checked settings without their prefix (nodes, gpus_per_node, spares, partition, account, time,
    signal_seconds, sbatch_extra) and the options every job of the site gets (``site_options``), ``submit`` the login
    hosts in inventory order, ``user`` the user jobs are submitted as (like the nodes' cluster user: one, not root).
    """
    errors: list[str] = []
    chosen = {str(row["name"]): str(row.get("scheduler") or "ssh") for row in rows}
    for name, value in chosen.items():
        if value not in SCHEDULERS:
            errors.append(f"{name}: vidcluster_scheduler {value!r} is not one of {', '.join(SCHEDULERS)}")
    if len(set(chosen.values())) > 1:
        listed = ", ".join(f"{name}={value}" for name, value in chosen.items())
        errors.append(f"vidcluster_scheduler differs between hosts ({listed}); it is one setting for the cluster")
    scheduler = next(iter(chosen.values()), "ssh")
    submit = [str(row["name"]) for row in rows if row["group"] == "slurm_submit"]
    nodes = [str(row["name"]) for row in rows if row["group"] != "slurm_submit"]
    for row in rows:
        for key in sorted(set(row.get("slurm") or {}) - set(SLURM_DEFAULTS)):
            errors.append(f"{row['name']}: {key} is not a Slurm setting (known: {', '.join(SLURM_DEFAULTS)})")
    if scheduler != "slurm":
        if submit:
            errors.append(f"the group slurm_submit lists {', '.join(submit)} but vidcluster_scheduler is not slurm; "
                          "set vidcluster_scheduler: slurm for a Slurm site, or remove the group")
        for row in rows:
            for key in sorted(set(row.get("slurm") or {}) & set(SLURM_DEFAULTS)):
                errors.append(f"{row['name']}: {key} is set but vidcluster_scheduler is not slurm; set "
                              "vidcluster_scheduler: slurm, or remove it")
        return {"scheduler": scheduler, "submit": [], "user": "", "slurm": {}, "min_nodes": None, "errors": errors}
    if not submit:
        errors.append("vidcluster_scheduler is slurm but the group slurm_submit (the login host(s) jobs are submitted "
                      "from) has no hosts")
    if nodes:
        errors.append(f"vidcluster_scheduler is slurm, where the allocation picks the compute nodes, but "
                      f"{', '.join(nodes)} are in trainers or spares; list only the login host(s), in slurm_submit")
    given = [dict(row.get("slurm") or {}) for row in rows if row["group"] == "slurm_submit"]
    if any(settings != given[0] for settings in given[1:]):
        errors.append(f"the vidcluster_slurm_* settings differ between the login hosts {', '.join(submit)}; set them "
                      "once, for the group")
    users = {str(row["name"]): str(row.get("user") or controller_user or getpass.getuser())
             for row in rows if row["group"] == "slurm_submit"}
    if len(set(users.values())) > 1:
        listed = ", ".join(f"{name}={user}" for name, user in users.items())
        errors.append(f"ansible_user differs between the login hosts ({listed}); jobs run as one user")
    user = next(iter(users.values()), "")
    if user == "root":
        errors.append("ansible_user is root; submit jobs as the cluster's ordinary user")
    slurm = _slurm_settings({k: v for k, v in (given[0] if given else {}).items() if k in SLURM_DEFAULTS}, errors)
    logins = [row for row in rows if row["group"] == "slurm_submit"]
    trainers = slurm.get("nodes")
    min_nodes = _min_nodes(logins, trainers, errors) if logins and isinstance(trainers, int) else None
    return {"scheduler": scheduler, "submit": submit, "user": user, "slurm": slurm, "min_nodes": min_nodes,
            "errors": errors}


def job_id(given: Any, config: Any = "") -> dict[str, str]:
    """``{id, error}``: the job id a playbook acts on (``given``, -e job_id; else the config's file name without
    .yaml; '' when neither is given: every job), or why it cannot be one (it could name another folder, or break a
    command line)."""
    value = str(given) if given not in (None, "") else re.sub(r"\.ya?ml$", "", str(config or "").rstrip("/")
                                                               .rsplit("/", 1)[-1])
    layout = trainer_module(LAYOUT)
    if value and not layout.valid_job_id(value):
        source = "-e job_id" if given not in (None, "") else "the name of -e config"
        return {"id": "", "error": f"job id {value!r} ({source}) names a folder on every node: use "
                                   f"{layout.JOB_ID_CHARS}"}
    return {"id": value, "error": ""}


RELEASE = "ansible-playbook playbooks/check-cluster.yml -e release="


def held_out(text: str, path: str, members: Sequence[str]) -> dict[str, Any]:
    """The nodes playbooks/check-cluster.yml -e act=true held out of the launches: ``text`` is the file at ``path``
    ('' when there is none), ``{"held_out": {node: why}}``. Returns ``{nodes: {node: why}, errors}``: the file that is
    not such an object, or each held-out node the inventory's trainers and spares (``members``) lack, named with the
    command that releases it."""
    if not text.strip():
        return {"nodes": {}, "errors": []}
    try:
        found = json.loads(text)
    except ValueError as exc:
        return {"nodes": {}, "errors": [f"{path} is not JSON ({exc}); {RELEASE}all writes it again"]}
    nodes = found.get("held_out") if isinstance(found, dict) else None
    if not isinstance(nodes, dict) or not all(isinstance(why, str) for why in nodes.values()):
        return {"nodes": {}, "errors": [f'{path} is not {{"held_out": {{"NODE": "why", ...}}}}; {RELEASE}all writes '
                                        "it again"]}
    return {"nodes": nodes, "errors": [
        f"{name}, held out in {path}, is not in the inventory's trainers or spares; release it: {RELEASE}{name}"
        for name in nodes if name not in members]}


class FilterModule:
    """Registers the functions above as Ansible filters."""

    def filters(self) -> dict[str, Callable[..., Any]]:
        return {"cluster_contract": cluster_contract, "cluster_scheduler_contract": scheduler_contract,
                "cluster_resolve_address": resolve_address, "cluster_job_id": job_id,
                "cluster_held_out": held_out}
