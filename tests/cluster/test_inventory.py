"""The inventory contract (roles/cluster_inventory): one check, run by every playbook before any node is touched.

Inventories here name hosts on loopback addresses (127.0.0.x): should a check wrongly pass and a playbook try to
connect, nothing but this machine is reached.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.conftest import REPO, flat, run_playbook

VALIDATE = REPO / "playbooks" / "validate-inventory.yml"
_spec = importlib.util.spec_from_file_location(
    "cluster_inventory", REPO / "roles" / "cluster_inventory" / "filter_plugins" / "cluster_inventory.py"
)
assert _spec is not None and _spec.loader is not None
contract_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(contract_module)
cluster_contract = contract_module.cluster_contract


def inventory(tmp_path: Path, hosts: dict[str, str], group_vars: str = "ansible_user: trainer") -> Path:
    path = tmp_path / "hosts.yml"
    lines = ["all:", "  children:", "    trainers:", "      hosts:"]
    lines += [f"        {name}: {spec}" for name, spec in hosts.items()]
    lines += ["      vars:", f"        {group_vars}"]
    path.write_text("\n".join(lines) + "\n")
    return path


def row(name: str, **given: Any) -> dict[str, Any]:
    return {"name": name, "ansible_host": None, "cluster_ip": None, "node_rank": None, "gpus": None,
            "ansible_port": None, "ansible_user": "trainer", **given}


def test_sample_inventory_is_valid() -> None:
    # Without the login check: the sample's hosts are documentation addresses, never to be connected to.
    proc = run_playbook(VALIDATE, "--skip-tags", "login", inventory=REPO / "inventory" / "sample" / "hosts.yml")
    assert "Ask each node which user" not in proc.stdout


@pytest.mark.parametrize(
    ("hosts", "group_vars", "message"),
    [
        ({"a": "{ansible_host: 127.0.0.2}", "b": "{ansible_host: 127.0.0.3, cluster_ip: 127.0.0.2}"},
         "ansible_user: trainer", "cluster address 127.0.0.2 is used by a, b"),
        ({"a": "{ansible_host: 127.0.0.2, node_rank: 0}", "b": "{ansible_host: 127.0.0.3, node_rank: 2}"},
         "ansible_user: trainer", "node_rank must number the nodes 0..1, each once; got a=0, b=2"),
        ({"a": "{ansible_host: 127.0.0.2, node_rank: 0}", "b": "{ansible_host: 127.0.0.3}"},
         "ansible_user: trainer", "node_rank is set for some nodes but not for b"),
        ({"a": "{ansible_host: 127.0.0.2}", "b": "{ansible_host: 127.0.0.3, cluster_ip: no-such-node.invalid}"},
         "ansible_user: trainer",
         "b: cluster_ip (default ansible_host) 'no-such-node.invalid' is not an IP address and does not resolve"),
        ({"a": "{ansible_host: 127.0.0.2}", "b": "{ansible_host: 127.0.0.3}"},
         "ansible_user: root", "ansible_user is root"),
        ({"a": "{ansible_host: 127.0.0.2, ansible_user: alice}", "b": "{ansible_host: 127.0.0.3, ansible_user: bob}"},
         "ansible_port: 22", "ansible_user differs between nodes (a=alice, b=bob)"),
        ({"a": "{ansible_host: 127.0.0.2, gpus: [0, 0]}", "b": "{ansible_host: 127.0.0.3, gpus: 2}"},
         "ansible_user: trainer", "a: gpus [0, 0] is not a list of distinct device ids"),
        ({"a": "{ansible_host: 127.0.0.2, gpus: eight}", "b": "{ansible_host: 127.0.0.3}"},
         "ansible_user: trainer", "a: gpus 'eight' is neither a GPU count nor a list of device ids"),
        ({"a": "{ansible_host: 127.0.0.2, ansible_port: 70000}", "b": "{ansible_host: 127.0.0.3}"},
         "ansible_user: trainer", "a: ansible_port 70000 is not a TCP port"),
        ({"'../x'": "{ansible_host: 127.0.0.2}", "'node 1'": "{ansible_host: 127.0.0.3}"},
         "ansible_user: trainer", "'../x': a node's inventory name names its folders on every node and its entry in "
         "~/.ssh/config; use letters, digits, '.', '_' and '-', starting with a letter or digit, at most 64; "
         "'node 1': a node's inventory name"),
        ({"a": "{ansible_host: 127.0.0.2}", "b": "{ansible_host: 127.0.0.3}"},
         "{ansible_user: trainer, vidcluster_min_nodes: 3}",
         "vidcluster_min_nodes 3 is above the number of trainers (2): a job cannot train on more nodes than it has"),
        ({"a": "{ansible_host: 127.0.0.2}", "b": "{ansible_host: 127.0.0.3}"},
         "{ansible_user: trainer, vidcluster_min_nodes: 0}",
         "vidcluster_min_nodes 0 is below 1 (the fewest nodes a job trains on)"),
        ({"a": "{ansible_host: 127.0.0.2}", "b": "{ansible_host: 127.0.0.3}"},
         "{ansible_user: trainer, vidcluster_min_nodes: two}",
         "vidcluster_min_nodes 'two' is not an integer (the fewest nodes a job trains on, 1 to the 2 trainers)"),
    ],
    ids=["duplicate-address", "rank-gap", "rank-some", "dns-unresolvable", "root-user", "user-differs",
         "gpus-duplicate-ids", "gpus-word", "port-out-of-range", "node-names", "min-nodes-above", "min-nodes-below",
         "min-nodes-word"],
)
def test_each_broken_rule_is_named(tmp_path: Path, hosts: dict[str, str], group_vars: str, message: str) -> None:
    proc = run_playbook(VALIDATE, inventory=inventory(tmp_path, hosts, group_vars), check=False)
    assert proc.returncode != 0
    assert message in proc.stdout, proc.stdout[-3000:]
    assert "breaks the contract of inventory/README.md" in proc.stdout


def test_min_nodes_is_the_groups_one_integer_and_unset_means_every_trainer() -> None:
    nodes = [row("a", ansible_host="127.0.0.2"), row("b", ansible_host="127.0.0.3"),
             row("s", ansible_host="127.0.0.4", spare=True)]
    assert cluster_contract(nodes)["min_nodes"] is None
    given = cluster_contract([{**r, "min_nodes": "1"} for r in nodes])  # -e extra vars arrive as strings
    assert (given["min_nodes"], given["errors"]) == (1, [])
    differs = cluster_contract([{**nodes[0], "min_nodes": 1}, {**nodes[1], "min_nodes": 2}])
    assert differs["min_nodes"] is None
    assert differs["errors"] == ["vidcluster_min_nodes differs between nodes (a=1, b=2); it is the job's: set it once "
                                 "for the group cluster"]


def test_empty_trainers_group_fails_clearly(tmp_path: Path) -> None:
    path = tmp_path / "hosts.yml"
    path.write_text("all:\n  hosts:\n    other: {ansible_host: 127.0.0.20}\n")
    proc = run_playbook(VALIDATE, inventory=path, check=False)
    assert proc.returncode != 0
    assert "no hosts in the group 'trainers'" in proc.stdout


def test_ansible_version_window_is_checked(tmp_path: Path) -> None:
    path = inventory(tmp_path, {"a": "{ansible_host: 127.0.0.2}"})
    proc = run_playbook(VALIDATE, "-e", "cluster_inventory_ansible_max=2.10", inventory=path, check=False)
    assert proc.returncode != 0
    assert "is outside the tested window 2.17 <= version < 2.10" in proc.stdout


def test_dns_name_is_resolved_once_and_mixed_gpu_forms_count_alike() -> None:
    layout = cluster_contract([
        row("a", ansible_host="127.0.0.2", gpus=[2, 3], node_rank=1),
        row("b", ansible_host="127.0.0.3", cluster_ip="localhost", gpus="2", node_rank=0, ansible_port=2222),
    ])
    assert layout["errors"] == []
    assert layout["order"] == ["b", "a"] and layout["root"] == "b"
    a, b = layout["nodes"]["a"], layout["nodes"]["b"]
    assert (a["gpus"], a["devices"], b["gpus"], b["devices"]) == (2, [2, 3], 2, None)
    # The name is resolved on the controller: the address is what from= and the rendezvous use.
    assert b["ip"] == "127.0.0.1"
    assert b["addresses"] == ["127.0.0.1", "127.0.0.3"]
    assert b["names"] == ["b", "127.0.0.3", "localhost", "127.0.0.1"]
    assert (a["port"], b["port"]) == (22, 2222)


@pytest.mark.parametrize("playbook", ["setup-cluster.yml", "launch-training.yml", "stop-training.yml",
                                      "training-status.yml", "playbooks/stage-data.yml"])
def test_every_playbook_checks_the_contract_before_touching_a_node(tmp_path: Path, playbook: str) -> None:
    path = inventory(tmp_path, {"a": "{ansible_host: 127.0.0.2}", "b": "{ansible_host: 127.0.0.3, "
                                "cluster_ip: 127.0.0.2}"})
    proc = run_playbook(playbook, "-e", "config=i3d_cpu_test", "-e", "src=/tmp", "-e", "dest=x", inventory=path,
                        check=False)
    assert proc.returncode != 0
    assert "cluster address 127.0.0.2 is used by a, b" in proc.stdout, proc.stdout[-3000:]
    # It stopped on the controller: no task ran on a node (not even fact gathering).
    assert "Gathering Facts" not in proc.stdout
    assert "UNREACHABLE" not in proc.stdout


def test_spares_follow_the_same_rules_and_come_after_the_trainers(tmp_path: Path) -> None:
    layout = cluster_contract([row("a", ansible_host="127.0.0.2"), row("s", ansible_host="127.0.0.4", spare=True),
                               row("b", ansible_host="127.0.0.3")])
    assert layout["errors"] == []
    assert (layout["order"], layout["spares"], layout["members"]) == (["a", "b"], ["s"], ["a", "b", "s"])
    assert layout["nodes"]["s"]["rank"] is None and layout["nodes"]["s"]["spare"] is True
    broken = cluster_contract([row("a", ansible_host="127.0.0.2"),
                               row("s", ansible_host="127.0.0.2", spare=True, node_rank=1)])
    assert "s: node_rank is set on a spare; spares take the rank of the node they replace" in broken["errors"]
    assert "cluster address 127.0.0.2 is used by a, s; every node needs its own cluster_ip" in broken["errors"]
    path = tmp_path / "hosts.yml"
    path.write_text("all:\n  children:\n    trainers:\n      hosts:\n        a: {ansible_host: 127.0.0.2}\n"
                    "        b: {ansible_host: 127.0.0.3}\n    spares:\n      hosts:\n        b:\n"
                    "  vars:\n    ansible_user: trainer\n")
    proc = run_playbook(VALIDATE, inventory=path, check=False)
    assert proc.returncode != 0
    assert "b is in both groups trainers and spares; a node is one or the other" in proc.stdout, proc.stdout[-3000:]


scheduler_contract = contract_module.scheduler_contract
SLURM_OK = {"vidcluster_slurm_nodes": 2, "vidcluster_slurm_gpus_per_node": 0}


def login_row(name: str = "login", **slurm: Any) -> dict[str, Any]:
    return {"name": name, "group": "slurm_submit", "scheduler": "slurm", "user": "trainer",
            "slurm": {**SLURM_OK, **slurm}}


def test_a_slurm_site_is_its_login_host_and_its_settings(tmp_path: Path) -> None:
    checked = scheduler_contract([login_row(vidcluster_slurm_time="1-2:30", vidcluster_slurm_spares="1",
                                            vidcluster_slurm_sbatch_extra=[" --qos=high "])])
    assert checked["errors"] == []
    assert (checked["scheduler"], checked["submit"], checked["user"]) == ("slurm", ["login"], "trainer")
    assert checked["slurm"] == {"nodes": 2, "gpus_per_node": 0, "spares": 1, "signal_seconds": 300, "partition": "",
                                "account": "", "time": "1-2:30", "sbatch_extra": ["--qos=high"],
                                "cpus_per_task": "all", "mem": "0", "gpus_per_task": False, "gpu_bind": "",
                                "site_options": ["--exclusive", "--mem=0", "--qos=high"]}
    assert checked["min_nodes"] is None
    assert scheduler_contract([{**login_row(), "min_nodes": 1}])["min_nodes"] == 1  # of vidcluster_slurm_nodes 2
    gpu = scheduler_contract([login_row(vidcluster_slurm_gpus_per_node=8, vidcluster_slurm_partition="gpu")])
    assert gpu["slurm"]["site_options"] == ["--partition=gpu", "--gres=gpu:8", "--exclusive", "--mem=0"]
    # The sample passes the whole check where a playbook works on Slurm sites (its host is never connected to).
    sample = REPO / "inventory" / "sample-slurm" / "hosts.yml"
    run_playbook(VALIDATE, "--skip-tags", "login", "-e", '{"cluster_inventory_schedulers": ["ssh", "slurm"]}',
                 inventory=sample)
    # Without it (the default), the playbook refuses a Slurm site by name before touching anything.
    proc = run_playbook(VALIDATE, inventory=sample, check=False)
    assert proc.returncode != 0 and "UNREACHABLE" not in proc.stdout
    assert "this playbook works with vidcluster_scheduler ssh only: on a Slurm site the compute nodes are reached " \
           "through Slurm jobs" in flat(proc.stdout), proc.stdout[-3000:]


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([login_row(vidcluster_slurm_partiton="gpu")],
         "login: vidcluster_slurm_partiton is not a Slurm setting (known: vidcluster_slurm_nodes,"),
        ([{**login_row(), "slurm": {"vidcluster_slurm_gpus_per_node": 0}}],
         "vidcluster_slurm_nodes is not set; a Slurm site needs it"),
        ([login_row(vidcluster_slurm_nodes=0)], "vidcluster_slurm_nodes 0 is not a whole number >= 1"),
        ([login_row(vidcluster_slurm_time="90 min")], "vidcluster_slurm_time '90 min' is not a Slurm time limit"),
        ([login_row(vidcluster_slurm_time="5", vidcluster_slurm_signal_seconds=300)],
         "vidcluster_slurm_signal_seconds 300 is not less than the time limit (5 = 300 s)"),
        ([login_row(vidcluster_slurm_sbatch_extra=["--time=10"])],
         "vidcluster_slurm_sbatch_extra item '--time=10': --time is set by vidcluster_slurm_time"),
        ([login_row(vidcluster_slurm_sbatch_extra=["--qos=a\n#SBATCH --x"])],
         "is not one sbatch option (--name[=value])"),
        ([login_row(vidcluster_slurm_partition="gpu a")], "vidcluster_slurm_partition 'gpu a' is not a Slurm name"),
        ([{**login_row(), "user": "root"}], "ansible_user is root; submit jobs as the cluster's ordinary user"),
        ([login_row(), {"name": "a", "group": "trainers", "scheduler": "slurm", "slurm": {}}],
         "but a are in trainers or spares; list only the login host(s), in slurm_submit"),
        ([{**login_row(), "slurm": {}, "scheduler": None}],
         "the group slurm_submit lists login but vidcluster_scheduler is not slurm"),
        ([{"name": "a", "group": "trainers", "scheduler": None, "slurm": {"vidcluster_slurm_nodes": 2}}],
         "a: vidcluster_slurm_nodes is set but vidcluster_scheduler is not slurm"),
        ([{"name": "a", "group": "trainers", "scheduler": "pbs", "slurm": {}}],
         "a: vidcluster_scheduler 'pbs' is not one of ssh, slurm"),
        ([login_row(), {"name": "a", "group": "trainers", "scheduler": None, "slurm": {}}],
         "vidcluster_scheduler differs between hosts (login=slurm, a=ssh)"),
        ([{**login_row(), "min_nodes": 3}], "vidcluster_min_nodes 3 is above the number of trainers (2)"),
    ],
    ids=["unknown-setting", "nodes-missing", "nodes-zero", "time-format", "signal-after-start", "owned-option",
         "option-with-newline", "partition-space", "root", "trainers-under-slurm", "submit-without-slurm",
         "setting-without-slurm", "unknown-scheduler", "scheduler-differs", "min-nodes-above-slurm-nodes"],
)
def test_each_broken_slurm_rule_is_named(rows: list[dict[str, Any]], message: str) -> None:
    errors = scheduler_contract(rows)["errors"]
    assert any(message in error for error in errors), errors


def test_a_slurm_setting_on_an_ssh_cluster_is_refused_by_name(tmp_path: Path) -> None:
    path = inventory(tmp_path, {"a": "{ansible_host: 127.0.0.2}"}, "vidcluster_slurm_partition: gpu")
    proc = run_playbook(VALIDATE, inventory=path, check=False)
    assert proc.returncode != 0
    assert "a: vidcluster_slurm_partition is set but vidcluster_scheduler is not slurm" in proc.stdout, (
        proc.stdout[-3000:])
