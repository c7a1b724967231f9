"""Matching environments (roles/python_env, roles/nvidia_driver, playbooks/environment.yml).

The filter and requirement-check tests are plain function tests. The cluster tests run the playbook for real on a
2-node local cluster (network-namespace hosts with their own sshd and private homes):
  - each node installs the real pinned requirements.txt into its own ~/vidcluster/venv (the 5.5 GB CUDA torch
    stack) offline, from a wheelhouse the controller built; a second run changes nothing and does not call pip;
  - node1's torch is really replaced by torch 2.13.0+cpu; with python_env_shared_fs claimed (but the homes are
    private) only node0 installs and the comparison fails naming node1 and the torch row; a normal run repairs
    node1 alone;
  - a shared path (/tmp is the same directory on every local node) is installed once, from a wheelhouse copied to
    the installing node only, and verified by all;
  - check mode on fresh nodes creates nothing; nvidia_driver passes check mode on this Debian controller.
Run: .venv/bin/python -m pytest tests/cluster/test_environment.py  (root). Measured on the shared 2-core machine:
about 14.5 min in all; the two parallel real installs 347 s, the repair 89 s, installing the CPU torch on node1
~80 s, a second run 37 s, teardown of the two 6 GB environments ~170 s.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.cluster.conftest import REPO, VENV_BIN, LocalCluster, Node, changed_total, run_playbook

ROLE = REPO / "roles" / "python_env"
PLAYBOOK = REPO / "playbooks" / "environment.yml"
# The local nodes are offline (no route out of their namespaces, and this machine's local package index is
# configured for root only), exactly the case of the wheelhouse mode: the controller downloads once (cached in
# .cache/wheelhouse across runs) and the nodes install with --no-index. They share the controller's filesystem,
# so they read that wheelhouse in place: copying 3 GB over ssh to each node takes this 2-core machine ~6 min.
# The copy itself is tested with a small requirements file (test_shared_path_...).
OFFLINE = ("-e", "python_env_wheelhouse=true", "-e", "python_env_wheelhouse_copy=false")
PER_NODE = ("-e", "vidcluster_env_path=~/vidcluster/venv", "-e", "python_env_shared_fs=false", *OFFLINE)
PIP_TASK = "Install the pinned requirements with pip"
SITE = Path("vidcluster/venv/lib/python3.11/site-packages")
CPU_TORCH = next(Path("/opt/wheels").glob("torch-2.13.0+cpu-*.whl"), None)


def _load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


filters = _load(ROLE / "filter_plugins" / "python_env.py")
check_requirements = _load(ROLE / "files" / "check_requirements.py")


def task_lines(stdout: str, task: str) -> list[str]:
    """The per-host result lines ('changed: [node0]', 'skipping: [node1]') of one task in the default output."""
    block = stdout.split(f"TASK [python_env : {task}]", 1)[1].split("TASK [", 1)[0]
    return [line for line in block.splitlines() if re.match(r"(ok|changed|skipping|fatal): \[", line)]


def torch_dist(home: Path, env: Path = SITE) -> list[str]:
    """Versions of the torch distributions installed in a node's environment, read from the controller side."""
    return sorted(
        p.name.removeprefix("torch-").removesuffix(".dist-info") for p in (home / env).glob("torch-*.dist-info")
    )


# --- filters and the requirement check ----------------------------------------------------------------------


def test_version_table_names_the_differing_node_and_versions() -> None:
    same = {"python": "3.11.2", "cuda": "13.0", "gpus": [], "driver": "n/a"}
    reports: dict[str, dict[str, Any]] = {
        "node0": {**same, "torch": "2.14.1+cu130"},
        "node1": {**same, "torch": "2.13.0+cpu", "gpus": [{"name": "NVIDIA H200"}] * 2, "driver": "580.65.06"},
    }
    result = filters.version_table(reports, ["python", "torch", "cuda"], ["gpus", "driver"])
    assert not result["ok"]
    assert result["differing"] == ["torch"]  # GPUs and driver are shown, not compared
    assert result["diff_table"][0].split() == ["node", "torch"]
    assert result["diff_table"][2:] == ["node0  2.14.1+cu130", "node1  2.13.0+cpu"]
    assert result["summary"] == ["torch: 2.14.1+cu130 on node0; 2.13.0+cpu on node1"]
    assert "2x NVIDIA H200" in result["table"][3] and result["table"][2].split()[-2:] == ["none", "n/a"]
    assert filters.version_table({"a": same, "b": dict(same)}, ["python", "cuda"])["ok"]


def test_driver_requirements_for_the_cuda_of_the_torch_build() -> None:
    table = {"12.1": "530.30.02", "12.8": "570.26", "13.0": "580.65.06"}
    assert filters.cuda_min_driver("13.0", table) == "580.65.06"
    assert filters.cuda_min_driver("12.8.1", table) == "570.26"
    with pytest.raises(ValueError, match=r"CUDA 12\.2 is not in python_env_driver_table"):
        filters.cuda_min_driver("12.2", table)
    assert filters.driver_supports("580.65.06", "580.65.06")
    assert filters.driver_supports("580.105.08", "580.65.06")  # numeric, not string, comparison
    assert not filters.driver_supports("570.172.08", "580.65.06")
    assert filters.torch_cuda_from_requirements("numpy\ntorch==2.5.1+cu121  # pinned\n", "13.0") == "12.1"
    assert filters.torch_cuda_from_requirements((REPO / "requirements.txt").read_text(), "13.0") == "13.0"
    assert filters.parse_gpus(["NVIDIA H200, 580.65.06, 143771 MiB", ""]) == [
        {"name": "NVIDIA H200", "driver": "580.65.06", "memory": "143771 MiB"}
    ]


def test_requirement_check_compares_installed_versions() -> None:
    import paramiko

    lines = [
        "# comment",
        "--extra-index-url https://example.invalid/simple",
        f"paramiko=={paramiko.__version__}",
        "pyyaml>=6.0,<7  # inline comment",
        "paramiko<1",
        "surely-not-installed-vidcluster==1.0",
        "skipped-by-marker==1.0; python_version < '3'",
        "-r other.txt",
    ]
    assert check_requirements.unsatisfied(lines) == [
        f"paramiko<1 (installed {paramiko.__version__})",
        "surely-not-installed-vidcluster==1.0 (not installed)",
        "-r other.txt (not checked here)",
    ]


def test_lint_is_clean() -> None:
    paths = ["roles/python_env", "roles/nvidia_driver", "playbooks/environment.yml"]
    lint = subprocess.run(
        [str(VENV_BIN / "ansible-lint"), "--profile", "production", *paths],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr
    config = (
        ["-c", ".yamllint"]
        if (REPO / ".yamllint").exists()
        else ["-d", "{extends: default, rules: {line-length: {max: 120}}}"]
    )
    yaml = subprocess.run(
        [str(VENV_BIN / "yamllint"), "--strict", *config, *paths], cwd=REPO, capture_output=True, text=True, check=False
    )
    assert yaml.returncode == 0, yaml.stdout + yaml.stderr
    ruff = subprocess.run(
        [str(VENV_BIN / "ruff"), "check", "roles/python_env", __file__],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert ruff.returncode == 0, ruff.stdout


def test_nvidia_driver_role_passes_check_mode_on_this_debian_host(tmp_path: Path) -> None:
    inventory = tmp_path / "controller.yml"
    inventory.write_text(
        "trainers:\n  hosts:\n    controller:\n      ansible_connection: local\n"
        "      ansible_python_interpreter: /usr/bin/python3\n"
    )
    proc = run_playbook(
        PLAYBOOK, "--check", "--tags", "nvidia-driver", "-e", "nvidia_driver_enabled=true", inventory=inventory
    )
    assert "Add the Debian non-free components as an apt source" in proc.stdout
    assert not Path("/etc/apt/sources.list.d/vidcluster-nonfree.sources").exists()
    off = run_playbook(PLAYBOOK, "--check", "--tags", "nvidia-driver", inventory=inventory)
    assert "nvidia_driver : " not in off.stdout  # off by default: the role is not even included


# --- a real 2-node cluster --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(local_cluster: Any) -> Iterator[LocalCluster]:
    made: LocalCluster = local_cluster(2)
    yield made
    made.destroy()  # frees the two ~6 GB environments as soon as this module is done


def test_check_mode_on_fresh_nodes_creates_nothing(cluster: LocalCluster) -> None:
    proc = cluster.playbook(PLAYBOOK, "--check", *PER_NODE)
    assert "no environment at /home/vctrain/vidcluster/venv" in proc.stdout
    for node in cluster.nodes:
        assert not (node.home / "vidcluster").exists()


def test_each_node_installs_the_pinned_requirements_for_real(cluster: LocalCluster) -> None:
    started = time.monotonic()
    proc = cluster.playbook(PLAYBOOK, *PER_NODE)
    elapsed = time.monotonic() - started
    print(f"per-node install of requirements.txt on {len(cluster.nodes)} nodes: {elapsed:.0f} s")
    assert sorted(task_lines(proc.stdout, PIP_TASK)) == [f"changed: [{node.name}]" for node in cluster.nodes]
    for node in cluster.nodes:
        assert torch_dist(node.home) == ["2.14.1"]
        assert not (node.home / "vidcluster" / "wheelhouse").exists()  # read in place, not copied
        assert re.search(rf"{node.name}\s+3\.11\.\d+\s+2\.14\.1\+cu130\s+13\.0\s+\d+\s+[\d.]+\s+0\.29\.1", proc.stdout)


def test_second_run_changes_nothing_and_does_not_reinstall(cluster: LocalCluster) -> None:
    marker = cluster.nodes[0].home / SITE / "torch-2.14.1.dist-info" / "RECORD"
    before = marker.stat().st_mtime_ns
    started = time.monotonic()
    proc = cluster.playbook(PLAYBOOK, *PER_NODE)
    elapsed = time.monotonic() - started
    print(f"second run: {elapsed:.0f} s")
    assert changed_total(proc.stdout) == 0
    assert sorted(task_lines(proc.stdout, PIP_TASK)) == [f"skipping: [{node.name}]" for node in cluster.nodes]
    assert marker.stat().st_mtime_ns == before
    assert elapsed < 120


def _install_cpu_torch(cluster: LocalCluster, node: Node) -> None:
    assert CPU_TORCH is not None, "torch 2.13.0+cpu wheel missing from /opt/wheels"
    cluster.ssh(node, f"~/vidcluster/venv/bin/pip install -q --no-deps --force-reinstall {CPU_TORCH}")
    assert torch_dist(node.home) == ["2.13.0+cpu"]


def test_node_with_a_different_torch_fails_the_comparison_naming_it(cluster: LocalCluster) -> None:
    node0, node1 = cluster.nodes
    _install_cpu_torch(cluster, node1)
    # Claimed shared filesystem, private homes in reality: node0 installs (nothing to do), every node verifies.
    proc = cluster.playbook(
        PLAYBOOK,
        "-e",
        "python_env_shared_fs=true",
        "-e",
        "vidcluster_env_path=~/vidcluster/venv",
        *OFFLINE,
        check=False,
    )
    assert proc.returncode != 0
    assert "Environments differ between nodes in: torch," in proc.stdout
    assert re.search(rf"^\s*{node1.name}\s+2\.13\.0\+cpu\b", proc.stdout, re.M)  # the diff table's node1 row
    assert re.search(rf"^\s*{node0.name}\s+2\.14\.1\+cu130\b", proc.stdout, re.M)
    assert f"torch: 2.14.1+cu130 on {node0.name}; 2.13.0+cpu on {node1.name}" in proc.stdout
    assert torch_dist(node1.home) == ["2.13.0+cpu"]  # verified, not silently changed


def test_normal_run_repairs_only_the_drifted_node(cluster: LocalCluster) -> None:
    node0, node1 = cluster.nodes
    proc = cluster.playbook(PLAYBOOK, *PER_NODE)
    assert sorted(task_lines(proc.stdout, PIP_TASK)) == [f"changed: [{node1.name}]", f"skipping: [{node0.name}]"]
    assert torch_dist(node1.home) == ["2.14.1"]


@pytest.fixture
def tiny_requirements(tmp_path: Path) -> Path:
    """A small real requirements file (paramiko and its 6 dependencies) for the install-mode tests."""
    path = tmp_path / "requirements.txt"
    path.write_text("paramiko==4.0.0\n")
    return path


def test_shared_path_is_installed_once_and_verified_by_all(
    cluster: LocalCluster, tiny_requirements: Path, tmp_path: Path
) -> None:
    shared = Path(f"/tmp/vidcluster-{cluster.name}-shared")  # /tmp is one directory for every local node
    try:
        proc = cluster.playbook(
            PLAYBOOK,
            "-e",
            f"vidcluster_env_path={shared}/venv",
            "-e",
            "python_env_shared_fs=true",
            "-e",
            f"python_env_requirements_file={tiny_requirements}",
            "-e",
            "python_env_wheelhouse=true",
            "-e",
            f"python_env_wheelhouse_controller_dir={tmp_path / 'wheelhouse'}",
        )
        node0, node1 = cluster.nodes
        assert sorted(task_lines(proc.stdout, PIP_TASK)) == [f"changed: [{node0.name}]", f"skipping: [{node1.name}]"]
        for node in cluster.nodes:
            assert re.search(
                rf"^\s*- {node.name}\s+3\.11\.\d+\s+missing(\s+n/a){{3}}\s+missing\s+missing\s+4\.0\.0\b",
                proc.stdout,
                re.M,
            )
        assert (shared / "venv/lib/python3.11/site-packages/paramiko-4.0.0.dist-info").is_dir()
        assert (shared / "wheelhouse" / "paramiko-4.0.0-py3-none-any.whl").is_file()
    finally:
        shutil.rmtree(shared, ignore_errors=True)
