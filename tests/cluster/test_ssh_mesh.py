"""setup-cluster.yml on a fresh 3-node local cluster, run whole as a user would: the SSH key mesh, the environment
step, idempotence, and the all-pairs check's classified failures (sshd down, lost authorized key, changed host key)
and key rotation.

The local nodes come with the repository's .venv pre-installed read-only at /opt/vidcluster/venv (their inventory
says so, with python_env_shared_fs: true), so the environment step finds the pinned versions, verifies and compares
them without installing, and the SSH probe runs with that environment's paramiko. Per-node installs and a node
that differs are tested in test_environment.py."""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.cluster.conftest import CLUSTER_PLAYBOOK, LocalCluster, Node, changed_total, run_playbook

PAIR = re.compile(r"(\S+) -> (\S+): (\w+) \(")


def setup_cluster(cluster: LocalCluster, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return cluster.playbook("setup-cluster.yml", *args, check=check)


def ssh_check(cluster: LocalCluster, via_setup_tag: bool = False) -> subprocess.CompletedProcess[str]:
    """The check alone: its own playbook, or setup-cluster.yml --tags ssh-check."""
    args = ("setup-cluster.yml", "--tags", "ssh-check") if via_setup_tag else ("playbooks/ssh-check.yml",)
    return cluster.playbook(*args, check=False)


def task_lines(stdout: str, task: str) -> list[str]:
    """The sorted per-host result lines ('ok: [node0]', 'skipping: [node1]') of one python_env task."""
    block = stdout.split(f"TASK [python_env : {task}]", 1)[1].split("TASK [", 1)[0]
    return sorted(line for line in block.splitlines() if re.match(r"(ok|changed|skipping|fatal): \[", line))


def broken_pairs(output: str) -> dict[tuple[str, str], str]:
    """{(src, dst): reason} from the check's failure message."""
    return {(m[1], m[2]): m[3] for m in PAIR.finditer(output)}


def cluster_pubkey(cluster: LocalCluster) -> str:
    return (cluster.state_dir / "cluster-key" / "cluster_key.pub").read_text().split()[1]


def restart_sshd(cluster: LocalCluster) -> None:
    run_playbook(CLUSTER_PLAYBOOK, "-e", f"nodes={len(cluster.nodes)}", "-e", f"cluster_name={cluster.name}")


def stop_sshd(node: Node) -> None:
    pid = node.sshd_pid
    subprocess.run(["kill", str(pid)], check=True)
    while Path(f"/proc/{pid}").exists():
        time.sleep(0.1)


@pytest.fixture(scope="module")
def mesh(local_cluster: Callable[[int], LocalCluster]) -> Iterator[tuple[LocalCluster, str]]:
    cluster = local_cluster(3)
    first = setup_cluster(cluster)
    yield cluster, first.stdout
    cluster.destroy()


def test_plain_openssh_from_every_node_to_every_node(mesh: tuple[LocalCluster, str]) -> None:
    cluster, first_run = mesh
    assert "ok        |        ok        |        ok" in first_run
    targets = " ".join([n.ip for n in cluster.nodes] + [n.name for n in cluster.nodes])
    for node in cluster.nodes:
        script = (f"for t in {targets}; do ssh -o BatchMode=yes -o StrictHostKeyChecking=yes $t true "
                  "|| echo FAILED $t; done")
        out = cluster.ssh(node, script)
        assert "FAILED" not in out.stdout + out.stderr, (node.name, out.stdout, out.stderr)


def test_environment_step_verifies_the_preinstalled_environment(mesh: tuple[LocalCluster, str]) -> None:
    cluster, first_run = mesh
    # Shared environment: the first node checks the pins (satisfied), nobody creates, copies or installs anything.
    assert task_lines(first_run, "Compare the installed versions with the pinned requirements") == [
        "ok: [node0]", "skipping: [node1]", "skipping: [node2]"]
    for task in ("Copy the pinned requirements into the environment", "Install the pinned requirements with pip"):
        assert task_lines(first_run, task) == [f"skipping: [{n.name}]" for n in cluster.nodes], task
    # Every node reports the same versions, from the shared path, and the comparison passes.
    for node in cluster.nodes:
        assert re.search(rf"^\s*- {node.name}\s+3\.11\.\d+\s+2\.14\.1\+cu130\s+13\.0\s+\d+\s+[\d.]+\s+0\.29\.1\S*"
                         r"\s+0\.6\.0\s+4\.0\.0\s", first_run, re.M), first_run[-4000:]
    assert "Environments differ" not in first_run
    probe = "/opt/vidcluster/venv/bin/python -c 'import torch, paramiko; print(torch.__version__)'"
    assert cluster.ssh(cluster.nodes[2], probe).stdout.strip() == "2.14.1+cu130"


def test_second_run_changes_nothing(mesh: tuple[LocalCluster, str]) -> None:
    cluster, _ = mesh
    assert changed_total(setup_cluster(cluster).stdout) == 0


def test_keys_installed_once_with_right_modes(mesh: tuple[LocalCluster, str]) -> None:
    cluster, _ = mesh
    pub = cluster_pubkey(cluster)
    for node in cluster.nodes:
        ssh_dir = node.home / ".ssh"
        assert ssh_dir.stat().st_mode & 0o777 == 0o700
        assert (ssh_dir / "vidcluster_rsa").stat().st_mode & 0o777 == 0o600
        assert (ssh_dir / "vidcluster_rsa.pub").stat().st_mode & 0o777 == 0o644
        assert not (ssh_dir / "id_rsa").exists()
        lines = (ssh_dir / "authorized_keys").read_text().splitlines()
        ours = [line for line in lines if pub in line]
        assert len(ours) == 1
        assert ours[0].startswith('from="') and f"vidcluster-cluster-key {cluster.name}" in ours[0]
        for other in cluster.nodes:
            assert other.ip in ours[0].split()[0]
        assert any("local-cluster-controller" in line for line in lines)  # the user's other keys stay


def test_sshd_down_is_reported_as_refused(mesh: tuple[LocalCluster, str]) -> None:
    cluster, _ = mesh
    down = cluster.nodes[2]
    stop_sshd(down)
    try:
        proc = ssh_check(cluster, via_setup_tag=True)
    finally:
        restart_sshd(cluster)
    assert proc.returncode != 0
    pairs = broken_pairs(proc.stdout)
    for src in cluster.nodes[:2]:
        assert pairs[(src.name, down.name)] == "refused", proc.stdout[-3000:]
    assert not [p for p in pairs if down.name not in p], pairs


def test_lost_authorized_key_names_exactly_the_pairs_into_that_node(mesh: tuple[LocalCluster, str]) -> None:
    cluster, _ = mesh
    victim = cluster.nodes[1]
    auth = victim.home / ".ssh" / "authorized_keys"
    pub = cluster_pubkey(cluster)
    auth.write_text("".join(line + "\n" for line in auth.read_text().splitlines() if pub not in line))
    proc = ssh_check(cluster)
    assert proc.returncode != 0
    expected = {(n.name, victim.name): "auth_refused" for n in cluster.nodes}
    assert broken_pairs(proc.stdout) == expected, proc.stdout[-3000:]
    # The trust step puts it back.
    setup_cluster(cluster, "--tags", "trust")
    assert sum(pub in line for line in auth.read_text().splitlines()) == 1


def test_changed_host_key_is_reported_and_never_accepted(mesh: tuple[LocalCluster, str]) -> None:
    cluster, _ = mesh
    changed = cluster.nodes[2]
    known_before = {n.name: (n.home / ".ssh" / "known_hosts").read_bytes() for n in cluster.nodes}
    stop_sshd(changed)
    key = changed.dir / "ssh" / "ssh_host_ed25519_key"
    key.unlink()
    key.with_suffix(".pub").unlink()
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"root@{changed.netns}", "-f", str(key)],
                   check=True)
    # The local-cluster playbook restarts the sshd and, like an admin who verified the new key out of band,
    # updates the controller's own known_hosts; the nodes' known_hosts still hold the old key.
    restart_sshd(cluster)
    proc = ssh_check(cluster)
    assert proc.returncode != 0
    assert broken_pairs(proc.stdout) == {(n.name, changed.name): "changed_host_key" for n in cluster.nodes}, (
        proc.stdout[-3000:])
    assert {n.name: (n.home / ".ssh" / "known_hosts").read_bytes() for n in cluster.nodes} == known_before
    # The trust step takes the new key from the controller's verified connection (the rotation test below
    # runs the whole playbook, check included, on the repaired mesh).
    setup_cluster(cluster, "--tags", "trust")


def test_rotation_replaces_the_key_everywhere(mesh: tuple[LocalCluster, str]) -> None:
    cluster, _ = mesh
    old = cluster_pubkey(cluster)
    setup_cluster(cluster, "-e", "rotate_cluster_key=true")
    new = cluster_pubkey(cluster)
    assert new != old
    for node in cluster.nodes:
        auth = (node.home / ".ssh" / "authorized_keys").read_text()
        assert old not in auth
        assert auth.count(new) == 1
        assert new in (node.home / ".ssh" / "vidcluster_rsa.pub").read_text()
    # The rotated mesh works with plain OpenSSH too.
    out = cluster.ssh(cluster.nodes[0], f"ssh -o BatchMode=yes -o StrictHostKeyChecking=yes {cluster.nodes[2].ip} true")
    assert out.returncode == 0
