"""The host firewall of the training data plane (roles/cluster_firewall, setup-cluster.yml -e firewall=true).

  - its module in a network namespace of its own, wired to a second one that holds an admitted address and an
    outsider (IPv4 and IPv6), for both tools (nftables, iptables): a guarded port refuses the outsider and admits the
    cluster, other ports stay open, a second run changes nothing, and the rules go away whole;
  - on the 3-node private-home cluster (private_cluster, whose login user may use sudo on the nodes): a node whose
    cluster_ip is not its ansible_host is admitted from its cluster_ip only; setup-cluster.yml
    -e firewall=true makes a node's rendezvous port refuse the controller's bridge address and admit the other nodes,
    a second run changes nothing, a job still trains across the guarded nodes, and -e firewall=false removes it all
    (the slow lane: bash scripts/test.sh --slow).
Run: .venv/bin/python -m pytest -n 0 tests/cluster/test_firewall.py  (root).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.conftest import (
    REPO,
    VENV_BIN,
    LocalCluster,
    changed_total,
    flat,
    job_processes,
    run_playbook,
    stage_dataset,
)

MODULE = REPO / "roles" / "cluster_firewall" / "library" / "cluster_firewall_rules.py"
CONNECT = """import json, socket, sys
out = []
for source, host, port in json.loads(sys.argv[1]):
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        s.bind((source, 0))
        try:
            s.connect((host, port))
            out.append("open")
        except ConnectionRefusedError:
            out.append("refused")
        except OSError as exc:
            out.append(type(exc).__name__)
print(json.dumps(out))
"""
LISTEN = """import socket, sys, threading
def serve(port):
    s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)  # both families, as torch's store listens
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("::", port))
    s.listen(16)
    while True:
        s.accept()[0].close()
for port in sys.argv[1:]:
    threading.Thread(target=serve, args=(int(port),), daemon=True).start()
print("listening", flush=True)
threading.Event().wait()
"""


def netns(name: str, *argv: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", "netns", "exec", name, *argv], capture_output=True, text=True, check=True, **kwargs)


@contextlib.contextmanager
def listening(ns: str, *ports: int) -> Iterator[None]:
    """A process in ``ns`` that accepts (and closes) every connection to these ports, on every address."""
    proc = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", LISTEN, *map(str, ports)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "listening"
        yield
    finally:
        proc.kill()
        proc.wait()


def tries(ns: str | None, attempts: list[tuple[str, str, int]]) -> list[str]:
    """open / refused / the error, of each (source address, destination, port), from ``ns`` (None: this machine)."""
    argv = [sys.executable, "-c", CONNECT, json.dumps(attempts)]
    done = subprocess.run(["ip", "netns", "exec", ns, *argv] if ns else argv, capture_output=True, text=True,
                          check=True, timeout=60)
    return json.loads(done.stdout)


# ---- the module, in a namespace of its own ----
@pytest.fixture
def wired() -> Iterator[dict[str, str]]:
    """Two namespaces on one veth: "node" (10.77.0.1, fd77::1) and "peer", which holds an admitted address (.2, ::2)
    and an outsider (.3, ::3)."""
    names = {"node": f"vcfw{os.getpid()}n", "peer": f"vcfw{os.getpid()}p"}
    for name in names.values():
        subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "link", "add", "vcfwa", "netns", names["node"], "type", "veth", "peer", "name", "vcfwb",
                        "netns", names["peer"]], check=True)  # fmt: skip
        for side, link, addresses in (("node", "vcfwa", ["10.77.0.1/24", "fd77::1/64"]),
                                      ("peer", "vcfwb", ["10.77.0.2/24", "10.77.0.3/24", "fd77::2/64", "fd77::3/64"])):
            for address in addresses:
                netns(names[side], "ip", "addr", "add", address, "dev", link, *(["nodad"] if ":" in address else []))
            netns(names[side], "ip", "link", "set", link, "up")
            netns(names[side], "ip", "link", "set", "lo", "up")
        yield names
    finally:
        for name in names.values():
            subprocess.run(["ip", "netns", "delete", name], check=False)


def module(ns: str, tmp_path: Path, **args: Any) -> dict[str, Any]:
    """The module run as Ansible runs it (its arguments in a file), in ``ns``; its JSON result."""
    given = tmp_path / "args.json"
    given.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": args}))
    done = subprocess.run(["ip", "netns", "exec", ns, str(VENV_BIN / "python"), str(MODULE), str(given)],
                          capture_output=True, text=True, check=False)
    return json.loads(done.stdout)


@pytest.mark.parametrize("backend", ["nftables", "iptables"])
def test_a_guarded_port_admits_the_cluster_only_idempotently_and_removably(
        wired: dict[str, str], tmp_path: Path, backend: str) -> None:
    node, peer = wired["node"], wired["peer"]
    guard = {"ports": ["29500-29599", "ephemeral"], "addresses": ["10.77.0.2", "fd77::2/128"], "backend": backend}
    checks = [("10.77.0.2", "10.77.0.1", 29500), ("10.77.0.3", "10.77.0.1", 29500), ("10.77.0.3", "10.77.0.1", 40000),
              ("10.77.0.3", "10.77.0.1", 8000), ("fd77::2", "fd77::1", 29500), ("fd77::3", "fd77::1", 29500)]
    with listening(node, 29500, 40000, 8000):
        assert tries(peer, checks) == ["open"] * 6  # no rules yet
        first = module(node, tmp_path, **guard)
        assert first["changed"] and first["backend"] == backend, first
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        assert first["ports"] == ["29500-29599", f"{low}-{high}"]
        # The cluster's address gets in; the outsider is refused on the rendezvous and the ephemeral ports (both
        # families), and still reaches a port that is not guarded.
        assert tries(peer, checks) == ["open", "refused", "refused", "open", "open", "refused"]
        assert module(node, tmp_path, **guard)["changed"] is False  # idempotent
        grown = module(node, tmp_path, **{**guard, "addresses": [*guard["addresses"], "10.77.0.3"]})
        assert grown["changed"] and tries(peer, checks[1:2]) == ["open"]  # a changed list replaces the rules
        gone = module(node, tmp_path, state="absent", backend=backend)
        assert gone["changed"] and tries(peer, checks) == ["open"] * 6
        assert module(node, tmp_path, state="absent", backend=backend)["changed"] is False
    listed = netns(node, "nft", "list", "ruleset").stdout
    assert "vidcluster" not in listed and "VIDCLUSTER" not in listed  # nothing left (iptables-nft shows here too)


SITE_DROP = {  # the site's own rule, after the guard: port 29500 dropped from the admitted 10.77.0.2
    "nftables": [["nft", "add", "table", "inet", "site"],
                 ["nft", "add", "chain", "inet", "site", "input", "{ type filter hook input priority 10; }"],
                 ["nft", "add", "rule", "inet", "site", "input", "ip", "saddr", "10.77.0.2", "tcp", "dport", "29500",
                  "drop"]],
    "iptables": [["iptables", "-A", "INPUT", "-s", "10.77.0.2", "-p", "tcp", "--dport", "29500", "-j", "DROP"]],
}


@pytest.mark.parametrize("backend", ["nftables", "iptables"])
def test_the_guard_admits_to_the_sites_own_rules_which_still_decide(
        wired: dict[str, str], tmp_path: Path, backend: str) -> None:
    """A guard, not an opening: an admitted address goes on to the node's own rules (a site's DROP of a port from it
    still drops)."""
    node, peer = wired["node"], wired["peer"]
    guard = {"ports": ["29500-29599", "ephemeral"], "addresses": ["10.77.0.2"], "backend": backend}
    checks = [("10.77.0.2", "10.77.0.1", 29500), ("10.77.0.2", "10.77.0.1", 29501), ("10.77.0.3", "10.77.0.1", 29501)]
    with listening(node, 29500, 29501):
        for command in SITE_DROP[backend]:
            netns(node, *command)
        assert tries(peer, checks) == ["TimeoutError", "open", "open"]  # the site's rule alone
        assert module(node, tmp_path, **guard)["changed"]
        assert tries(peer, checks) == ["TimeoutError", "open", "refused"]  # still dropped; the outsider refused
        assert module(node, tmp_path, state="absent", backend=backend)["changed"]


def test_bad_ports_and_addresses_are_refused_by_name(wired: dict[str, str], tmp_path: Path) -> None:
    for bad, said in ((["29500-29400"], "port '29500-29400': not a TCP port or range"),
                      (["http"], "port 'http': not a TCP port, a range a-b or 'ephemeral'")):
        out = module(wired["node"], tmp_path, ports=bad, addresses=["10.77.0.2"])
        assert out["failed"] and said in out["msg"], out
    out = module(wired["node"], tmp_path, ports=["29500"], addresses=["node1"])
    assert out["failed"] and "'node1' is not an IP address or network" in out["msg"]


# ---- on the cluster ----
LAUNCH_ARGS = ("-e", "ddp_launch_poll_seconds=2", "-e", "ddp_config_omp_num_threads=1", "-e", "master_port=auto",
               "-e", "ddp_launch_follow_hours=0.25")  # fmt: skip


@pytest.fixture(scope="module")
def cluster(private_cluster: tuple[LocalCluster, str],
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster, _ = private_cluster
    stage_dataset(cluster, tmp_path_factory.mktemp("data"), train=6, val=2)  # as the launch tests stage it
    yield cluster
    cluster.playbook("setup-cluster.yml", "--tags", "firewall", "-e", "firewall=false")  # whatever happened


def firewall(cluster: LocalCluster, on: bool) -> subprocess.CompletedProcess[str]:
    return cluster.playbook("setup-cluster.yml", "--tags", "firewall", "-e", f"firewall={str(on).lower()}")


@pytest.mark.slow  # a whole job on the guarded cluster: the slow lane
def test_the_rendezvous_port_refuses_the_controller_and_the_job_still_trains(cluster: LocalCluster) -> None:
    node0, node1, _ = cluster.nodes
    bridge = node0.ip.rsplit(".", 1)[0] + ".1"  # the controller's address on the cluster's bridge
    from_controller = [(bridge, node0.ip, 29500), (bridge, node0.ip, 40000)]
    with listening(node0.netns, 29500, 40000):
        assert tries(None, from_controller) == ["open", "open"]
        installed = firewall(cluster, True)
        assert changed_total(installed.stdout, cluster.names) == 3
        assert "node0 (nftables): new TCP connections to ports 29500-29599, " in flat(installed.stdout)
        assert tries(None, from_controller) == ["refused", "refused"]
        assert tries(node1.netns, [(node1.ip, node0.ip, 29500), (node1.ip, node0.ip, 40000)]) == ["open", "open"]
        assert changed_total(firewall(cluster, True).stdout, cluster.names) == 0  # idempotent

    # A job across the guarded nodes: rendezvous, gloo and the watch all on guarded ports, between cluster addresses.
    job = f"{cluster.name}-guarded"
    cluster.playbook("launch-training.yml", *LAUNCH_ARGS, "-e", "config=i3d_cpu_test", "-e", f"job_id={job}",
                     "-e", json.dumps({"ddp_config_overrides": {"CONFIG": {"TRAIN": {"EPOCH_NUM": 1}}}}))
    metrics = (REPO / "runs" / job / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["epoch"] for line in metrics if "epoch" in json.loads(line)] == [1]
    assert job_processes(job) == []

    removed = firewall(cluster, False)
    assert changed_total(removed.stdout, cluster.names) == 3 and "node0 (nftables): no vidcluster rules" in flat(
        removed.stdout)
    with listening(node0.netns, 29500, 40000):
        assert tries(None, from_controller) == ["open", "open"]


def test_a_nodes_ansible_host_is_not_admitted_only_its_cluster_ip(private_cluster: tuple[LocalCluster, str]) -> None:
    """node1 reached over SSH at its ansible_host (a NAT gateway's address, say) and training on another cluster_ip:
    the guard admits the cluster_ip and refuses the ansible_host."""
    cluster, _ = private_cluster
    node0, node1, node2 = cluster.nodes
    moved = node1.ip.rsplit(".", 1)[0] + ".250"  # on the cluster's bridge, as node1's second address
    assert moved not in {node.ip for node in cluster.nodes}
    inventory = cluster.state_dir / "inventory-moved.yml"
    text = cluster.inventory.read_text()
    assert text.count(f"cluster_ip: {node1.ip}\n") == 1
    inventory.write_text(text.replace(f"cluster_ip: {node1.ip}\n", f"cluster_ip: {moved}\n"))
    subprocess.run(["ip", "-n", node1.netns, "addr", "add", f"{moved}/32", "dev", "eth0"], check=True)
    try:
        with listening(node0.netns, 29500):
            installed = run_playbook("playbooks/firewall.yml", "-e", "firewall=true", inventory=inventory)
            admitted = re.search(rf"{node0.name} \(nftables\): new TCP connections to ports .*? only from "
                                 r"([0-9a-f:., ]+?)\.['\"]", flat(installed.stdout))
            assert admitted, installed.stdout[-3000:]
            assert sorted(admitted[1].split(", ")) == sorted([node0.ip, moved, node2.ip])
            assert tries(node1.netns, [(node1.ip, node0.ip, 29500), (moved, node0.ip, 29500)]) == ["refused", "open"]
    finally:
        run_playbook("playbooks/firewall.yml", "-e", "firewall=false", inventory=inventory, check=False)
        subprocess.run(["ip", "-n", node1.netns, "addr", "del", f"{moved}/32", "dev", "eth0"], check=False)
        inventory.unlink()
