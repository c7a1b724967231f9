"""setup-cluster.yml on a fresh 3-node local cluster, run whole as a user would: the SSH key mesh, the environment
step, idempotence, key rotation, and the all-pairs check's classified failures, each produced for real and reported
with its hint: timeout (a frozen sshd), unreachable (no route to a node), refused (sshd down), unknown host key,
changed host key, authentication refused (a lost authorized key) and no key.

The local nodes come with the repository's .venv pre-installed read-only at /opt/vidcluster/venv (their inventory
says so, with python_env_shared_fs: true), so the environment step finds the pinned versions, verifies and compares
them without installing, and the SSH probe runs with that environment's paramiko. Per-node installs and a node
that differs are tested in test_environment.py."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from tests.cluster.conftest import REPO, LocalCluster, Node, changed_total, flat

PAIR = re.compile(r"(\S+) -> (\S+): (\w+) \(")
# Short timeouts: a frozen sshd is reported after two tries of 5 s.
FAST_CHECK = ("-e", "ssh_check_timeout=5", "-e", "ssh_check_retry_pause=1")
HINTS = yaml.safe_load((REPO / "roles" / "ssh_check" / "vars" / "main.yml").read_text())["__ssh_check_hints"]


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
    cluster.repair()  # with the cluster's own settings (sudo on the nodes stays)


def stop_sshd(node: Node) -> None:
    pid = node.sshd_pid
    subprocess.run(["kill", str(pid)], check=True)
    while Path(f"/proc/{pid}").exists():
        time.sleep(0.1)


@pytest.fixture(scope="module")
def mesh(private_cluster: tuple[LocalCluster, str]) -> tuple[LocalCluster, str]:
    return private_cluster


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
                         r"\s+0\.6\.0\s+0\.17\.0\S*\s+5\.1\.\S+\s+4\.0\.0\s", first_run, re.M), first_run[-4000:]
    assert "Environments differ" not in first_run
    probe = "/opt/vidcluster/venv/bin/python -c 'import torch, paramiko; print(torch.__version__)'"
    assert cluster.ssh(cluster.nodes[2], probe).stdout.strip() == "2.14.1+cu130"


def test_second_run_changes_nothing(mesh: tuple[LocalCluster, str]) -> None:
    cluster, _ = mesh
    assert changed_total(setup_cluster(cluster).stdout, ["localhost", *cluster.names]) == 0


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
        assert ours[0].startswith('restrict,from="') and f"vidcluster-cluster-key {cluster.name}" in ours[0]
        for other in cluster.nodes:
            assert other.ip in ours[0].split()[0]
        assert any("local-cluster-controller" in line for line in lines)  # the user's other keys stay


def assert_reported(proc: subprocess.CompletedProcess[str], expected: dict[tuple[str, str], str]) -> None:
    """The check failed naming exactly these broken pairs, each reason with its hint."""
    assert proc.returncode != 0
    assert broken_pairs(proc.stdout) == expected, proc.stdout[-4000:]
    for reason in set(expected.values()):
        hint = " ".join(HINTS[reason].replace("{{ ssh_check_timeout }}", "5").split())  # as FAST_CHECK sets it
        assert f": {reason} ({hint}" in flat(proc.stdout), (reason, proc.stdout[-3000:])


def test_sshd_down_is_reported_as_refused(mesh: tuple[LocalCluster, str]) -> None:
    cluster, _ = mesh
    down = cluster.nodes[2]
    cluster.playbook("playbooks/ssh-check.yml", "--limit", down.name, check=False)  # keep the controller's connection
    stop_sshd(down)  # the listener: node2 refuses new connections, the controller's open one stays
    try:
        proc = ssh_check(cluster, via_setup_tag=True)
    finally:
        restart_sshd(cluster)
    assert_reported(proc, {(src.name, down.name): "refused" for src in cluster.nodes})


def test_frozen_sshd_lost_key_and_unknown_host_key_are_told_apart(mesh: tuple[LocalCluster, str]) -> None:
    cluster, _ = mesh
    node0, node1, node2 = cluster.nodes
    # node0 forgets node1's host key; node1 loses the cluster key; node2's sshd freezes (it accepts connections, as
    # the kernel does for a stopped process, but never answers). The controller keeps its open connection to node2.
    known = node0.home / ".ssh" / "known_hosts"
    known.write_text("".join(line for line in known.read_text().splitlines(keepends=True)
                             if "vidcluster-node:node1" not in line))
    (node1.home / ".ssh" / "vidcluster_rsa").unlink()
    cluster.playbook("playbooks/ssh-check.yml", "--limit", "node2", check=False)  # keep the controller's connection
    os.kill(node2.sshd_pid, signal.SIGSTOP)
    try:
        proc = cluster.playbook("playbooks/ssh-check.yml", *FAST_CHECK, check=False)
    finally:
        os.kill(node2.sshd_pid, signal.SIGCONT)
    assert_reported(proc, {
        ("node0", "node1"): "unknown_host_key", ("node0", "node2"): "timeout",
        ("node1", "node0"): "no_key", ("node1", "node1"): "no_key", ("node1", "node2"): "no_key",
        ("node2", "node2"): "timeout",
    })  # fmt: skip
    assert int(re.search(r"(\d+) needed a second try", proc.stdout)[1]) >= 2  # the two timeouts were tried again
    setup_cluster(cluster, "--tags", "keys,trust")  # puts the key and the host key back
    assert ssh_check(cluster).returncode == 0


def test_no_route_and_lost_authorized_key_name_exactly_the_pairs_into_those_nodes(
    mesh: tuple[LocalCluster, str],
) -> None:
    cluster, _ = mesh
    node0, node1, node2 = cluster.nodes
    auth = node1.home / ".ssh" / "authorized_keys"
    pub = cluster_pubkey(cluster)
    auth.write_text("".join(line + "\n" for line in auth.read_text().splitlines() if pub not in line))
    # node0 and node1 have no route to node2 (a broken network path); the controller still reaches every node.
    routes = [["ip", "-n", node.netns, "route", "add", "unreachable", f"{node2.ip}/32"] for node in (node0, node1)]
    for route in routes:
        subprocess.run(route, check=True)
    try:
        proc = cluster.playbook("playbooks/ssh-check.yml", *FAST_CHECK, check=False)
    finally:
        for route in routes:
            subprocess.run([*route[:4], "del", *route[5:]], check=True)
    # node2's own logins go out but their answers cannot come back: from node2, nodes 0 and 1 look silent.
    assert_reported(proc, {
        ("node0", "node1"): "auth_refused", ("node0", "node2"): "unreachable",
        ("node1", "node1"): "auth_refused", ("node1", "node2"): "unreachable",
        ("node2", "node0"): "timeout", ("node2", "node1"): "timeout",
    })  # fmt: skip
    setup_cluster(cluster, "--tags", "trust")  # the trust step puts the key back
    assert sum(pub in line for line in auth.read_text().splitlines()) == 1
    assert ssh_check(cluster).returncode == 0


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
    assert_reported(proc, {(n.name, changed.name): "changed_host_key" for n in cluster.nodes})
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
