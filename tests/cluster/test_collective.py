"""The nodes prove they can train together (roles/cluster_collective): setup-cluster.yml ends with an all-reduce across
every node over the cluster interface, reporting each node's bandwidth; a node whose ports a firewall closes (an
nftables rule in its network namespace) is named, and so is the rank-0 node whose rendezvous port is closed; a node
below the bandwidth floor is named with what carried its links.

The check itself (files/collective_check.py) runs here on loopback with real processes (several ranks per node too),
its rank layout and its reading of NCCL's log are tested as functions, and the report's naming
(filter_plugins/cluster_collective.py) is tested on the results each kind of failure gives. The cluster tests
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
check = load_file(CHECK)
# NCCL_DEBUG=INFO lines of a node (NCCL 2.2x) whose ranks 2 and 3 are its GPUs 0 and 1, between node0 (ranks 0, 1) and
# node2 (ranks 4, 5), with the job's network fallen back to sockets.
SOCKET_LOG = """\
node1:2345:2400 [0] NCCL INFO NET/IB : No device found.
node1:2345:2400 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.2<0>
node1:2345:2400 [0] NCCL INFO Using network Socket
node1:2345:2401 [0] NCCL INFO Channel 00/0 : 2[0] -> 3[1] via P2P/CUMEM/read
node1:2345:2401 [1] NCCL INFO Channel 00/0 : 3[1] -> 4[0] [send] via NET/Socket/0
node1:2345:2401 [0] NCCL INFO Channel 00/0 : 1[1] -> 2[0] [receive] via NET/Socket/0
node1:2345:2401 [0] NCCL INFO Channel 01/0 : 1[1] -> 2[0] [receive] via NET/Socket/1
node1:2345:2401 [0] NCCL INFO Connected all rings
"""


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
    from tests.ports import free_port

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
    assert re.fullmatch(r"b \(lo 127\.0\.0\.1\): gloo all-reduce of 4 MiB over 3 nodes \(1 of 3 ranks "
                        r"here\) in [\d.]+ ms: bus bandwidth "
                        r"[\d.]+ GB/s \(algorithm [\d.]+ GB/s\)", report["lines"][1])


def test_a_rendezvous_nobody_listens_on_is_refused_within_the_timeout() -> None:
    from tests.ports import free_port

    port = free_port()
    started = time.monotonic()
    proc = subprocess.run([sys.executable, str(CHECK), "--rank", "1", "--names", '["a", "b"]', "--root-addr",
                           "127.0.0.1", "--port", str(port), "--addr", "127.0.0.1", "--timeout", "4"],
                          capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    result = json.loads(proc.stdout)
    assert time.monotonic() - started < 30
    assert (result["failed"], result["error"]) == ("rendezvous", f"cannot reach a's rendezvous 127.0.0.1:{port}: "
                                                                 "refused")


def test_two_ranks_per_node_all_reduce_as_one_world() -> None:
    from tests.ports import free_port

    names = ["a", "b"]
    results = run_on_loopback(names, free_port(), "--cpu-ranks", "2", "--env",
                              json.dumps({"NCCL_IB_HCA": "mlx5_0", "PYTHONPATH": "/x"}))
    assert [r["ranks"] for r in results] == [{"first": 0, "count": 2, "world": 4}, {"first": 2, "count": 2, "world": 4}]
    for r in results:
        assert r["failed"] is None, r
        assert r["env"] == {"NCCL_IB_HCA": "mlx5_0"}  # the job's NCCL variables, nothing else of its environment
        assert r["bandwidth"]["busbw_gbps"] == pytest.approx(r["bandwidth"]["algbw_gbps"] * 2 * 3 / 4, rel=0.01)


def test_ranks_are_laid_out_one_per_gpu_with_nccl_and_as_configured_with_gloo() -> None:
    assert check.layout([8, 8, 4], "nccl", 1) == [8, 8, 4]
    assert check.layout([8, 0], "nccl", 1) == [8, 1]  # a node without a GPU still runs one rank, which names it
    assert check.layout([8, 8], "gloo", 1) == [1, 1]
    assert check.layout([0, 0, 0], "gloo", 3) == [3, 3, 3]
    assert check.job_env({"NCCL_IB_HCA": "mlx5", "TORCH_NCCL_BLOCKING_WAIT": "1", "PYTHONPATH": "/c", "GLOO_X": "y"}) \
        == {"NCCL_IB_HCA": "mlx5", "TORCH_NCCL_BLOCKING_WAIT": "1"}


def test_nccls_log_says_which_transport_carries_each_link() -> None:
    found = check.transports(SOCKET_LOG.splitlines())
    assert found == {"network": "Socket", "transports": {
        "P2P": [{"from": 2, "to": 3, "line": "Channel 00/0 : 2[0] -> 3[1] via P2P/CUMEM/read"}],
        "NET/Socket": [{"from": 3, "to": 4, "line": "Channel 00/0 : 3[1] -> 4[0] [send] via NET/Socket/0"},
                       {"from": 1, "to": 2, "line": "Channel 00/0 : 1[1] -> 2[0] [receive] via NET/Socket/0"}]}}
    fabric = check.transports([
        "n:1:2 [0] NCCL INFO Using network IB",
        "n:1:2 [1] NCCL INFO Channel 01/0 : 1[1] -> 2[0] [send] via NET/IB/0/GDRDMA",
        "n:1:2 [0] NCCL INFO Channel 00 : 0[1b000] -> 1[3d000] via P2P/IPC",  # older NCCL: bus ids in brackets
        "n:1:2 [0] NCCL INFO Channel 02/1 : 0[0] -> 1[1] via SHM/direct/direct",
        "n:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/AWS Libfabric/0/GDRDMA"])
    assert fabric["network"] == "IB"
    assert {kind: [(link["from"], link["to"]) for link in links] for kind, links in fabric["transports"].items()} == {
        "NET/IB": [(1, 2)], "P2P": [(0, 1)], "SHM": [(0, 1)], "NET/AWS Libfabric": [(0, 8)]}
    assert check.transports(["NCCL INFO Connected all rings", "unrelated"]) == {"network": None, "transports": {}}


def nccl_result(node: str, first: int, busbw: float) -> dict[str, str]:
    return result(node, backend="nccl", ranks={"first": first, "count": 2, "world": 6},
                  env={"NCCL_IB_HCA": "mlx5_0", "NCCL_SOCKET_IFNAME": "=eth0"},
                  nccl=check.transports(SOCKET_LOG.splitlines()) if node == "n1" else {"network": "IB",
                                                                                        "transports": {}},
                  bandwidth={"bytes": 2**26, "seconds": 0.1, "algbw_gbps": busbw * 0.6, "busbw_gbps": busbw})


def test_a_node_below_the_floor_is_named_with_its_transports_and_the_jobs_nccl_variables() -> None:
    runs = {"n0": nccl_result("n0", 0, 120.0), "n1": nccl_result("n1", 2, 9.0), "n2": nccl_result("n2", 4, 150.0)}
    found = collective.report(["n0", "n1", "n2"], runs, 64, 100.0)
    assert not found["ok"]
    assert found["problems"] == [
        "n1: 9 GB/s bus bandwidth, floor 100 GB/s: is NCCL falling back to sockets? The job's NCCL environment: "
        "NCCL_IB_HCA=mlx5_0, NCCL_SOCKET_IFNAME==eth0; NCCL's network: Socket; "
        'n0 -> n1 via NET/Socket ("Channel 00/0 : 1[1] -> 2[0] [receive] via NET/Socket/0"); '
        'n1 -> n2 via NET/Socket ("Channel 00/0 : 3[1] -> 4[0] [send] via NET/Socket/0")']
    assert "(2 of 6 ranks here, NCCL network Socket (NET/Socket, P2P)) in 100.0 ms: bus bandwidth 9.000" \
        in found["lines"][1]
    assert collective.report(["n0", "n1", "n2"], runs, 64, 5.0)["ok"]  # every node above a lower floor
    assert collective.report(["n0", "n1", "n2"], runs, 64)["ok"]  # no floor by default
    gloo = collective.report(["a"], {"a": result("a", bandwidth={"bytes": 1, "seconds": 1.0, "algbw_gbps": 0.3,
                                                                 "busbw_gbps": 0.4})}, 64, 1000.0)
    assert gloo["problems"] == ["a: 0.4 GB/s bus bandwidth, floor 1000 GB/s: gloo over eth0 (TCP sockets; nccl only "
                                "where every node has a GPU)"]


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
        assert re.search(rf"{node.name} \(eth0 {re.escape(node.ip)}\): gloo all-reduce of 64 MiB over 3 nodes \(1 of 3 "
                         r"ranks here\) in [\d.]+ ms: bus bandwidth [\d.]+ GB/s", flat(report)), report


def test_a_floor_above_what_the_links_give_names_every_node_below_it(private_cluster: tuple[LocalCluster, str]) -> None:
    """Two ranks per node (6 in all), a floor of 10 TB/s no veth reaches: the play fails naming each node below it."""
    cluster, _ = private_cluster
    proc = cluster.playbook("playbooks/collective-check.yml", "-e", "cluster_collective_min_busbw=10000", "-e",
                            "cluster_collective_cpu_ranks=2", "-e", "cluster_collective_megabytes=16", check=False)
    out = flat(proc.stdout)
    assert proc.returncode != 0, proc.stdout[-3000:]
    for node in cluster.nodes:
        assert re.search(rf"{node.name} \(eth0 {re.escape(node.ip)}\): gloo all-reduce of 16 MiB over 3 nodes \(2 of 6 "
                         r"ranks here\)", out), proc.stdout[-3000:]
        assert re.search(rf"{node.name}: [\d.e+-]+ GB/s bus bandwidth, floor 10000 GB/s: gloo over eth0 \(TCP sockets",
                         out), proc.stdout[-3000:]


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
