"""playbooks/local-cluster.yml: real namespace hosts, each with its own address, sshd and private home."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.cluster.conftest import (
    CLUSTER_PLAYBOOK,
    REPO,
    LocalCluster,
    Node,
    changed_total,
    cpu_quota,
    link_names,
    netns_names,
    run_playbook,
)

# Where every node sees its pre-installed environment (local_cluster_env_source, by default the repo's .venv).
ENV_MOUNT = "/opt/vidcluster/venv"


@pytest.fixture(scope="module")
def cluster(local_cluster: Callable[..., LocalCluster]) -> Iterator[LocalCluster]:
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


def test_repo_env_is_preinstalled_read_only(cluster: LocalCluster) -> None:
    # The login user runs the repository's .venv at the mount point; nothing can write into it from a node.
    probe = f"{ENV_MOUNT}/bin/python -c 'import sys, torch, paramiko; print(sys.prefix)'; touch {ENV_MOUNT}/x"
    out = cluster.ssh(cluster.nodes[1], probe, check=False)
    assert out.stdout.strip() == ENV_MOUNT, out.stderr
    assert "Read-only file system" in out.stderr
    assert not (REPO / ".venv" / "x").exists()
    text = cluster.inventory.read_text()
    assert f"vidcluster_env_path: {ENV_MOUNT}" in text and "python_env_shared_fs: true" in text


def test_env_source_the_user_cannot_reach_is_still_usable(cluster: LocalCluster, tmp_path: Path) -> None:
    # pytest's tmp_path lies under /tmp/pytest-of-root (0700): vctrain cannot reach it, only the bind mount.
    source = tmp_path / "venv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(source)], check=True)
    (source / "marker").write_text("seeded\n")
    node = cluster.nodes[0]
    args = ("-e", "nodes=2", "-e", f"cluster_name={cluster.name}")
    run_playbook(CLUSTER_PLAYBOOK, *args, "-e", f"local_cluster_env_source={source}")
    out = cluster.ssh(node, f"test ! -e {source}; cat {ENV_MOUNT}/marker; {ENV_MOUNT}/bin/python -c "
                            "'import sys; print(sys.prefix)'").stdout.split()
    assert out == ["seeded", ENV_MOUNT]
    # '' disables it: an empty mount point, and the inventory leaves the environment to the roles' defaults.
    # (The next test's default run puts the repository's .venv back.)
    run_playbook(CLUSTER_PLAYBOOK, *args, "-e", "local_cluster_env_source=")
    assert cluster.ssh(node, f"ls -A {ENV_MOUNT}").stdout == ""
    assert "vidcluster_env_path" not in cluster.inventory.read_text()


def _cpu_share_and_cgroups(cluster: LocalCluster, node: Node) -> tuple[float, str]:
    """The share of one CPU a 1.5 s busy loop started on the node over SSH (so it runs in the host's sshd's groups)
    got, and the cgroups it ran in."""
    probe = ("python3 -c 'import time\nw=time.time();c=time.process_time()\nwhile time.time()-w<1.5: pass\n"
             "print((time.process_time()-c)/(time.time()-w))\nprint(open(\"/proc/self/cgroup\").read())'")
    share, cgroups = cluster.ssh(node, probe).stdout.split("\n", 1)
    return float(share), cgroups


def test_cpu_quota_slows_only_that_host(cluster: LocalCluster) -> None:
    # The slow-node tests' tool: every new process of a host held to a tenth of a CPU runs in the quota's group and
    # gets at most about that share; its neighbour's do not, and the host is itself again once the block ends.
    # Shares, not speeds against the neighbour: another test busy on this machine's cores slows the neighbour too.
    node0, node1 = cluster.nodes
    with cpu_quota(node1, 0.1) as quota:
        (slowed, slowed_groups), (_, neighbour_groups) = (
            _cpu_share_and_cgroups(cluster, node1), _cpu_share_and_cgroups(cluster, node0))
    _, after_groups = _cpu_share_and_cgroups(cluster, node1)
    group = f"/{quota.name}\n"  # /proc/self/cgroup's lines end in the group's path
    assert group in slowed_groups and slowed < 0.2, (slowed, slowed_groups)
    assert group not in neighbour_groups, neighbour_groups
    assert group not in after_groups, after_groups


def test_restarts_a_stopped_sshd(cluster: LocalCluster) -> None:
    node = cluster.nodes[1]
    old = node.sshd_pid
    subprocess.run(["kill", str(old)], check=True)
    run_playbook(CLUSTER_PLAYBOOK, "-e", "nodes=2", "-e", f"cluster_name={cluster.name}")
    assert node.sshd_pid != old
    assert cluster.ssh(node, "true").returncode == 0
    # A default run also brings back the default environment source (the test above changed it).
    assert cluster.ssh(node, f"{ENV_MOUNT}/bin/python -c 'import paramiko'", check=False).returncode == 0


def test_second_run_changes_nothing(cluster: LocalCluster) -> None:
    proc = run_playbook(CLUSTER_PLAYBOOK, "-e", "nodes=2", "-e", f"cluster_name={cluster.name}")
    assert changed_total(proc.stdout, ["localhost"]) == 0, proc.stdout[-3000:]


def test_teardown_is_complete(cluster: LocalCluster) -> None:
    # Runs last in this module: the playbook alone (no force-delete) must leave nothing behind.
    pids = [n.sshd_pid for n in cluster.nodes]
    run_playbook(CLUSTER_PLAYBOOK, "-e", f"cluster_name={cluster.name}", "-e", "state=absent")
    assert not netns_names(cluster.name)
    assert not link_names(cluster.name)
    assert not any(Path(f"/proc/{pid}").exists() for pid in pids)
    assert not cluster.state_dir.exists()
