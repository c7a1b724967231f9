"""The nodes prove they can train together (roles/cluster_collective): setup-cluster.yml ends with an all-reduce across
every node over the cluster interface, reporting each node's bandwidth; a node whose ports a firewall closes (an
nftables rule in its network namespace) is named, and so is the rank-0 node whose rendezvous port is closed.

The check itself (files/collective_check.py) runs here on loopback with three real processes, and the report's
naming (filter_plugins/cluster_collective.py) is tested on the results each kind of failure gives. The cluster tests
use the session's 3-node private-home cluster (its setup-cluster.yml output included) and remove every rule they add.
The launch's short form runs in tests/cluster/test_launch_private_homes.py.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from typing import Any

import pytest

from tests.cluster.conftest import REPO, LocalCluster, closed_ports, flat, load_file

ROLE = REPO / "roles" / "cluster_collective"
CHECK = ROLE / "files" / "collective_check.py"
collective = load_file(ROLE / "filter_plugins" / "cluster_collective.py")


# --- the check on loopback, and the report -------------------------------------------------------------------


def run_on_loopback(names: list[str], port: int, *extra: str, timeout: float = 60) -> list[dict[str, Any]]:
    """collective_check.py as every node runs it, one process per name, all on 127.0.0.1."""
    procs = [subprocess.Popen([sys.executable, str(CHECK), "--rank", str(rank), "--names", json.dumps(names),
                               "--root-addr", "127.0.0.1", "--port", str(port), "--addr", "127.0.0.1", "--iface", "lo",
                               "--megabytes", "4", *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for rank in range(len(names))]  # fmt: skip
    outs = [proc.communicate(timeout=timeout) for proc in procs]
    assert all(proc.returncode == 0 for proc in procs), [err[-2000:] for _, err in outs]
    return [json.loads(out) for out, _ in outs]


def run_on_a_free_port(names: list[str]) -> list[dict[str, Any]]:
    """run_on_loopback on a port that was free a moment ago; again on another when something else on this machine
    (the other test worker) took it meanwhile."""
    from tests.trainer.test_distributed import free_port

    for _ in range(3):
        results = run_on_loopback(names, free_port())
        if not any("address already in use" in r["error"] for r in results):
            break
    return results


def test_three_processes_all_reduce_and_report_their_bandwidth() -> None:
    results = run_on_a_free_port(["a", "b", "c"])
    for rank, result in enumerate(results):
        assert result["failed"] is None, result
        assert result["rank"] == rank and result["iface"] == "lo" and result["backend"] == "gloo"
        assert set(result["pairs"]) == {"a", "b", "c"} - {result["node"]}
        assert set(result["pairs"].values()) == {"ok"}
        assert result["bandwidth"]["bytes"] == 4 * 2**20 and result["bandwidth"]["busbw_gbps"] > 0
    report = collective.report(["a", "b", "c"], {r["node"]: {"stdout": json.dumps(r)} for r in results}, 4)
    assert report["ok"] and report["problems"] == []
    assert re.fullmatch(r"b \(lo 127\.0\.0\.1\): gloo all-reduce of 4 MiB over 3 nodes in [\d.]+ ms: bus bandwidth "
                        r"[\d.]+ GB/s \(algorithm [\d.]+ GB/s\)", report["lines"][1])


def test_a_rendezvous_nobody_listens_on_is_refused_within_the_timeout() -> None:
    from tests.trainer.test_distributed import free_port

    port = free_port()
    started = time.monotonic()
    proc = subprocess.run([sys.executable, str(CHECK), "--rank", "1", "--names", '["a", "b"]', "--root-addr",
                           "127.0.0.1", "--port", str(port), "--addr", "127.0.0.1", "--timeout", "4"],
                          capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    result = json.loads(proc.stdout)
    assert time.monotonic() - started < 30
    assert (result["failed"], result["error"]) == ("rendezvous", f"cannot reach a's rendezvous 127.0.0.1:{port}: "
                                                                 "refused")


def result(node: str, **fields: Any) -> dict[str, str]:
    found = {"node": node, "rank": 0, "addr": "10.0.0.1", "iface": "eth0", "backend": "gloo", "failed": None,
             "error": "", "pairs": {}, "missing": [], "bandwidth": None, **fields}
    return {"stdout": json.dumps(found)}


def test_the_report_names_the_node_or_pair_that_could_not_join() -> None:
    names = ["n0", "n1", "n2"]
    unreached = {"failed": "rendezvous", "error": "cannot reach n0's rendezvous 10.0.0.1:29500: timed out"}
    waiting = {"failed": "rendezvous", "error": "never reached the rendezvous: n1, n2", "missing": ["n1", "n2"]}
    # Nobody reaches the rank-0 node: the rank-0 node is named, once.
    assert collective.report(names, {"n0": result("n0", **waiting), "n1": result("n1", **unreached),
                                     "n2": result("n2", **unreached)}, 64)["problems"] == [
        "no node can reach n0's rendezvous 10.0.0.1:29500 (timed out): a firewall on n0 closing port 29500, or a "
        "wrong cluster_ip for n0"]
    # One node cannot reach it: that node is named, and the root's wait is not a second finding.
    one = collective.report(names, {"n0": result("n0", **{**waiting, "missing": ["n2"]}), "n1": result("n1"),
                                    "n2": result("n2", **unreached)}, 64)
    assert one["problems"] == ["n2 cannot reach n0's rendezvous 10.0.0.1:29500: timed out"]
    # No peer can connect to n2: n2 is named; a single broken pair is named as a pair.
    stuck = {"failed": "pairs", "error": "pairs that cannot connect: ..."}
    pairs = {"n0": result("n0", pairs={"n1": "ok", "n2": "timed out"}, **stuck),
             "n1": result("n1", pairs={"n0": "refused", "n2": "timed out"}, **stuck),
             "n2": result("n2", pairs={"n0": "ok", "n1": "ok"}, **stuck)}
    assert collective.report(names, pairs, 64)["problems"] == [
        "n2 accepts no connection from n0, n1 (timed out): a firewall on n2 closing the ports gloo and NCCL listen on "
        "(the ephemeral range), or a wrong cluster interface", "n1 -> n0: refused"]
    # A node whose check did not run (no environment there, or the controller lost it) is named with why.
    lost = collective.report(names, {"n0": result("n0"), "n1": result("n1"), "n2": {"msg": "unreachable"}}, 64)
    assert lost["problems"] == ["n2: the check did not run to its end: unreachable"]
    assert lost["lines"][2] == "n2 (? ?): no all-reduce (its run step failed)"


# --- on the session's 3-node cluster ---------------------------------------------------------------------------


def test_setup_ends_with_an_all_reduce_reporting_each_nodes_bandwidth(
    private_cluster: tuple[LocalCluster, str],
) -> None:
    cluster, setup = private_cluster
    report = setup.split("TASK [cluster_collective : Show every node's all-reduce", 1)[1].split("TASK [", 1)[0]
    for node in cluster.nodes:
        assert re.search(rf"{node.name} \(eth0 {re.escape(node.ip)}\): gloo all-reduce of 64 MiB over 3 nodes in "
                         r"[\d.]+ ms: bus bandwidth [\d.]+ GB/s", flat(report)), report


@pytest.mark.slow  # two checks on the whole cluster, one waiting out its timeout: the slow lane
def test_a_node_whose_ports_a_firewall_closes_is_named(private_cluster: tuple[LocalCluster, str]) -> None:
    cluster, _ = private_cluster
    node2 = cluster.nodes[2]
    started = time.monotonic()
    with closed_ports(node2, cluster.ssh_port):
        proc = cluster.playbook("playbooks/collective-check.yml", "-e", "cluster_collective_timeout=20", check=False)
    took = time.monotonic() - started
    assert proc.returncode != 0
    assert ("The nodes cannot train together (gloo over the cluster interface): node2 accepts no connection from "
            "node0, node1 (timed out): a firewall on node2") in flat(proc.stdout), proc.stdout[-3000:]
    assert took < 120, f"{took:.0f} s"
    # The rule gone, the same check passes.
    again = cluster.playbook("playbooks/collective-check.yml", check=False)
    assert again.returncode == 0 and "bus bandwidth" in again.stdout, again.stdout[-3000:]
