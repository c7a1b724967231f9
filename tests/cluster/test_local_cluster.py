"""playbooks/local-cluster.yml: real namespace hosts, each with its own address, sshd and private home."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.cluster.conftest import (
    CLUSTER_PLAYBOOK,
    LocalCluster,
    changed_total,
    link_names,
    netns_names,
    run_playbook,
)


@pytest.fixture(scope="module")
def cluster(local_cluster: Callable[[int], LocalCluster]) -> Iterator[LocalCluster]:
    made = local_cluster(2)
    yield made
    made.destroy()


def test_nodes_have_own_address_and_sshd(cluster: LocalCluster) -> None:
    assert len({n.ip for n in cluster.nodes}) == 2
    assert len({n.sshd_pid for n in cluster.nodes}) == 2
    for node in cluster.nodes:
        assert Path(f"/proc/{node.sshd_pid}/exe").resolve() == Path("/usr/sbin/sshd")
        ns = subprocess.run(["ip", "netns", "identify", str(node.sshd_pid)], capture_output=True, text=True,
                            check=True).stdout.strip()
        assert ns == node.netns
        out = cluster.ssh(node, "id -un; ip -o -4 addr show dev eth0").stdout
        assert out.splitlines()[0] == "vctrain"
        assert f"inet {node.ip}/24" in out


def test_homes_are_private(cluster: LocalCluster) -> None:
    node0, node1 = cluster.nodes
    cluster.ssh(node0, "echo from-node0 > ~/marker")
    assert (node0.home / "marker").read_text() == "from-node0\n"
    assert not (node1.home / "marker").exists()
    assert cluster.ssh(node1, "test ! -e ~/marker", check=False).returncode == 0
    # Only the controller's key is authorised.
    assert len((node1.home / ".ssh" / "authorized_keys").read_text().splitlines()) == 1


def test_second_run_changes_nothing(cluster: LocalCluster) -> None:
    proc = run_playbook(CLUSTER_PLAYBOOK, "-e", "nodes=2", "-e", f"cluster_name={cluster.name}")
    assert changed_total(proc.stdout) == 0, proc.stdout[-3000:]


def test_restarts_a_stopped_sshd(cluster: LocalCluster) -> None:
    node = cluster.nodes[1]
    old = node.sshd_pid
    subprocess.run(["kill", str(old)], check=True)
    run_playbook(CLUSTER_PLAYBOOK, "-e", "nodes=2", "-e", f"cluster_name={cluster.name}")
    assert node.sshd_pid != old
    assert cluster.ssh(node, "true").returncode == 0


def test_teardown_is_complete(cluster: LocalCluster) -> None:
    # Runs last in this module: the playbook alone (no force-delete) must leave nothing behind.
    pids = [n.sshd_pid for n in cluster.nodes]
    run_playbook(CLUSTER_PLAYBOOK, "-e", f"cluster_name={cluster.name}", "-e", "state=absent")
    assert not netns_names(cluster.name)
    assert not link_names(cluster.name)
    assert not any(Path(f"/proc/{pid}").exists() for pid in pids)
    assert not cluster.state_dir.exists()
