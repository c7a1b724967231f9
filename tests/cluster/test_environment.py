"""Matching environments (roles/python_env, roles/nvidia_driver, playbooks/environment.yml, setup-cluster.yml).

The filter and requirement-check tests are plain function tests; nvidia_driver runs in check mode on this Debian
controller. The cluster tests run the playbooks for real on one 2-node local cluster (network-namespace hosts with
their own sshd and private homes, which come with the repository's .venv pre-installed read-only at
/opt/vidcluster/venv, see roles/local_cluster):
  - check mode on fresh nodes creates nothing;
  - each node installs a small pinned requirements file into its own ~/vidcluster/venv, offline, from a wheelhouse
    the controller downloads and copies to the nodes; each node has exactly those versions; a second run changes
    nothing and does not call pip;
  - node1 drifts: its environment is its own venv with torch 2.13.0+cpu (the real CPU wheel from /opt/wheels) over
    the shared stack, node0 keeps the shared one (torch 2.14.1); setup-cluster.yml fails at the comparison with a
    table naming node1 and torch with both versions, and changes neither node's environment;
  - the shared environment with both video decoders (DECODER auto): this host's FFmpeg libraries are found on every
    node (nothing installed), decord and torchcodec verified, torchcodec's and FFmpeg's versions compared.
The full requirements.txt (the 5.5 GB CUDA stack) is not installed per node here: setup-cluster.yml verifies the
pre-installed one on every local cluster (tests/cluster/test_ssh_mesh.py), and the install path is the same.
Lint of these roles runs with the whole repository's in tests/cluster/test_lint.py.
Run: .venv/bin/python -m pytest tests/cluster/test_environment.py  (root).
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster.conftest import REPO, LocalCluster, changed_total, flat, load_file, recap, run_playbook

ROLE = REPO / "roles" / "python_env"
PLAYBOOK = REPO / "playbooks" / "environment.yml"
PIP_TASK = "Install the pinned requirements with pip"
SITE = "lib/python3.11/site-packages"
SHARED_ENV = "/opt/vidcluster/venv"
CPU_TORCH = next(Path("/opt/wheels").glob("torch-2.13.0+cpu-*.whl"), None)
# Small, real pins (paramiko brings 6 compiled and pure dependencies), all on this machine's package index.
SMALL_REQUIREMENTS = "pyyaml==6.0.4\nparamiko==4.0.0\n"


filters = load_file(ROLE / "filter_plugins" / "python_env.py")
gpu_role = load_file(REPO / "roles" / "node_gpus" / "filter_plugins" / "node_gpus.py")
check_requirements = load_file(ROLE / "files" / "check_requirements.py")


def task_lines(stdout: str, task: str) -> list[str]:
    """The per-host result lines ('changed: [node0]', 'skipping: [node1]') of one task in the default output."""
    block = stdout.split(f"TASK [python_env : {task}]", 1)[1].split("TASK [", 1)[0]
    return sorted(line for line in block.splitlines() if re.match(r"(ok|changed|skipping|fatal): \[", line))


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


DRIVER_TABLE = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())["python_env_driver_table"]
BUILDS = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())["python_env_torch_builds"]


@pytest.mark.parametrize(("driver", "runs"), [
    ("525.60.13", {"12.1", "12.6", "12.8", "12.9"}),  # the first driver of CUDA 12's minor-version compatibility
    ("535.247.01", {"12.1", "12.6", "12.8", "12.9"}),  # Debian 12's, what roles/nvidia_driver installs there
    ("560.35.03", {"12.1", "12.6", "12.8", "12.9"}),
    ("580.65.06", {"12.1", "12.6", "12.8", "12.9", "13.0", "13.1", "13.2"}),
    ("580.105.08", {"12.1", "12.6", "12.8", "12.9", "13.0", "13.1", "13.2"}),  # numeric, not string, comparison
])  # fmt: skip
def test_the_driver_rule_is_cuda_minor_version_compatibility(driver: str, runs: set[str]) -> None:
    for cuda in ("12.1", "12.6", "12.8", "12.9", "13.0", "13.1", "13.2"):
        verdict = filters.driver_verdict(driver, cuda, DRIVER_TABLE)
        assert verdict["ok"] == (cuda in runs), (driver, cuda, verdict)
        assert verdict["needs"] == ("525.60.13" if cuda.startswith("12.") else "580.65.06")
    assert filters.driver_verdict("535.247.01", "13.0", DRIVER_TABLE)["message"] == (
        "NVIDIA driver 535.247.01 is too old for CUDA 13.0 builds, which need driver 580.65.06 or newer (every CUDA "
        "13.x build runs on it)")


def test_a_refused_driver_is_advised_only_builds_that_exist_and_it_runs() -> None:
    assert filters.builds_for_driver("535.247.01", BUILDS, DRIVER_TABLE) == ["cu126"]  # Debian 12's driver
    assert filters.builds_for_driver("580.65.06", BUILDS, DRIVER_TABLE) == ["cu126", "cu130", "cu132"]
    assert filters.builds_for_driver("450.80.02", BUILDS, DRIVER_TABLE) == []


def test_an_unknown_cuda_is_refused_with_a_message_not_an_exception() -> None:
    verdict = filters.driver_verdict("590.44.01", "14.0", DRIVER_TABLE)
    assert not verdict["ok"] and verdict["message"] == (
        "CUDA 14.0 is not in python_env_driver_table (known: 11, 12, 13); add the minimum driver NVIDIA's CUDA release "
        "notes give for it")
    # A site's more specific entry wins over its major's.
    assert filters.driver_verdict("550.54.14", "12.8", {**DRIVER_TABLE, "12.8": "570.26"})["needs"] == "570.26"


def test_the_build_chooses_the_index_and_the_pins() -> None:
    node = (REPO / "requirements-node.txt").read_text()
    cu126 = filters.torch_requirements(node, "cu126", BUILDS)
    assert cu126["ok"] and cu126["cuda"] == "12.6" and cu126["index"] == "https://download.pytorch.org/whl/cu126"
    lines = cu126["text"].splitlines()
    assert "--extra-index-url https://download.pytorch.org/whl/cu126" in lines
    assert "torch==2.14.1+cu126" in lines and "torchvision==0.29.1+cu126" in lines
    assert "torchcodec==0.17.0+cu126" in lines  # the build's own: PyPI's 0.17.0 is a CUDA 13.0 build
    assert [line for line in lines if line.startswith(("decord", "numpy"))] == ["decord==0.6.0", "numpy>=1.26,<3"]
    pypi = filters.torch_requirements(node, "cu130", BUILDS)  # torch 2.14's PyPI wheels: the file as it is
    assert pypi["text"] == node and pypi["cuda"] == "13.0"
    cpu = filters.torch_requirements(node, "cpu", BUILDS)
    assert cpu["cuda"] == "" and "torch==2.14.1+cpu" in cpu["text"].splitlines()
    assert "torchcodec==0.13.0" in cpu["text"].splitlines()  # PyPI's 0.13.0 is a CPU build
    assert filters.torch_requirements(node, "cu999", BUILDS)["message"] == (
        "vidcluster_torch_build 'cu999' is not one of python_env_torch_builds (cu126, cu130, cu132, cpu)")
    other = filters.torch_requirements("torch==2.5.1+cu121  # pinned\n", "cu132", BUILDS)
    assert not other["ok"] and "pin torch==2.5.1 (the build adds +cu132)" in other["message"]


def test_a_gpu_without_kernels_in_the_build_names_the_builds_that_have_them() -> None:
    cu130 = ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]
    report = {"torch": "2.14.1+cu130", "torch_archs": cu130, "gpu_checks": [
        {"index": 0, "name": "Tesla V100-SXM2-32GB", "capability": "7.0", "op": "CUDA error: no kernel image"},
        {"index": 1, "name": "NVIDIA A10G", "capability": "8.6", "op": "ok"}]}
    fit = filters.gpu_fit(report, "node3", BUILDS)
    assert fit["problems"] == [
        "node3 GPU 0 Tesla V100-SXM2-32GB sm_70: torch 2.14.1+cu130 has kernels for sm_75..sm_120; choose cu126 "
        "(vidcluster_torch_build)"]
    assert fit["record"] == ("node3: GPU 0 Tesla V100-SXM2-32GB sm_70, GPU 1 NVIDIA A10G sm_86; torch 2.14.1+cu130 "
                             "has kernels for sm_75..sm_120")
    broken = {**report, "gpu_checks": [{**report["gpu_checks"][1], "op": "RuntimeError: CUDA error: ECC error"}]}
    assert filters.gpu_fit(broken, "node1", BUILDS)["problems"] == [
        "node1 GPU 1 NVIDIA A10G sm_86: a small CUDA operation failed with torch 2.14.1+cu130: RuntimeError: CUDA "
        "error: ECC error"]
    assert "no build in python_env_torch_builds" in filters.gpu_fit(
        {**report, "gpu_checks": [{**report["gpu_checks"][0], "capability": "3.7"}]}, "k80", BUILDS)["problems"][0]


def test_kernels_run_within_their_major_version_and_ptx_beyond() -> None:
    assert filters.runs_on((8, 6), ["sm_80"]) and filters.runs_on((8, 9), ["sm_86"])  # newer minor, same major
    assert not filters.runs_on((8, 0), ["sm_86"])  # an older minor
    assert not filters.runs_on((10, 0), ["sm_90"])  # never across majors
    assert filters.runs_on((10, 0), ["sm_90", "compute_90"])  # PTX is compiled for what comes later
    assert filters.runs_on((9, 0), ["sm_90a"]) and not filters.runs_on((9, 1), ["sm_90a"])  # arch-specific
    assert filters.runs_on((12, 1), ["sm_120f"]) and not filters.runs_on((7, 0), [])


def test_a_gpu_split_by_mig_is_refused_naming_it() -> None:
    gpus = gpu_role.parse_gpus(["0, NVIDIA A100-SXM4-40GB, 580.65.06, 40960 MiB",
                                "1, NVIDIA A100-SXM4-40GB, 580.65.06, 40960 MiB"])
    assert gpu_role.mig_problem(["0, Disabled", "1, Enabled"], gpus, "node2") == (
        "node2: MIG is enabled on GPU 1 NVIDIA A100-SXM4-40GB; VidCluster trains one process per whole GPU (NCCL does "
        "not run between MIG instances): disable it (nvidia-smi -i <index> -mig 0 as root, then reset the GPU or "
        "reboot) or leave the node out of the inventory")
    assert gpu_role.mig_problem(["0, Disabled", "1, Disabled"], gpus, "node2") == ""
    assert gpu_role.mig_problem(["0, [N/A]"], gpus[:1], "t4") == ""  # a GPU without MIG


def test_the_gpu_query_is_parsed_with_commas_in_names() -> None:
    assert gpu_role.parse_gpus(["0, NVIDIA H200, 580.65.06, 143771 MiB", "1, Odd, Name, 580.65.06, 1 MiB", ""]) == [
        {"index": 0, "name": "NVIDIA H200", "driver": "580.65.06", "memory": "143771 MiB"},
        {"index": 1, "name": "Odd, Name", "driver": "580.65.06", "memory": "1 MiB"},
    ]


def test_decoder_check_names_what_a_node_lacks() -> None:
    fine = {"decord": "0.6.0", "torchcodec": "0.17.0+cu130", "ffmpeg": "5.1.9-0+deb12u1"}
    assert filters.decoder_problems(fine, ["decord", "torchcodec"]) == []
    assert filters.decoder_problems({**fine, "decord": "missing", "ffmpeg": "not found"}, ["decord"]) == [
        "decord is missing"
    ]
    assert filters.decoder_problems({**fine, "ffmpeg": "not found"}, ["decord", "torchcodec"]) == [
        "torchcodec 0.17.0+cu130 cannot load FFmpeg's shared libraries (not found)"
    ]
    assert filters.decoder_problems({"python": "no environment at /x"}, ["torchcodec"]) == ["torchcodec is missing"]
    assert filters.decoder_problems({**fine, "torchcodec": "broken: OSError: x"}, []) == []


def test_a_slurm_jobs_reports_name_their_nodes_and_what_keeps_each_from_training() -> None:
    # What tasks/slurm.yml reads: one file per task of the Slurm job, each report naming its node.
    good = {"torch": "2.14.1+cu130", "cuda": "13.0", "decord": "0.6.0", "torch_gpus": ["NVIDIA H200"] * 8,
            "driver": "580.65.06"}
    written = {"0": {"out": json.dumps({**good, "node": "gpu7"}), "err": ""},
               "1": {"out": json.dumps({**good, "node": "gpu9", "torch_gpus": [], "driver": "570.172.08"}), "err": ""},
               "2": {"out": "", "err": "slurmstepd: error: execve(): /home/u/venv/bin/python: No such file\n"}}
    seen = filters.slurm_reports(written)
    assert sorted(seen["reports"]) == ["gpu7", "gpu9"] and seen["reports"]["gpu7"]["gpus"] == good["torch_gpus"]
    assert seen["failed"] == {"task 2": "slurmstepd: error: execve(): /home/u/venv/bin/python: No such file"}
    problems = filters.slurm_problems(seen["reports"], 8, ["decord", "torchcodec"], {"13.0": "580.65.06"})
    assert problems == [
        "gpu7: torchcodec is missing",
        "gpu9: torch sees 0 GPU(s), the job was given 8 (vidcluster_slurm_gpus_per_node; a torch build without CUDA, "
        "or a driver that does not load?)",
        "gpu9: NVIDIA driver 570.172.08 is too old for CUDA 13.0 builds, which need driver 580.65.06 or newer (every "
        "CUDA 13.x build runs on it)",
        "gpu9: torchcodec is missing",
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


def test_nvidia_driver_role_passes_check_mode_on_this_debian_host(tmp_path: Path) -> None:
    inventory = tmp_path / "controller.yml"
    inventory.write_text(
        "trainers:\n  hosts:\n    controller:\n      ansible_connection: local\n"
        "      ansible_host: 127.0.0.1\n      ansible_user: vctrain\n"  # the inventory contract's needs; unused locally
        "      ansible_python_interpreter: /usr/bin/python3\n"
    )
    # This machine's own root runs the role locally (check mode), so the login check is skipped here.
    proc = run_playbook(PLAYBOOK, "--check", "--tags", "nvidia-driver", "--skip-tags", "login", "-e",
                        "nvidia_driver_enabled=true", inventory=inventory)
    assert "Add the Debian non-free components as an apt source" in proc.stdout
    assert not Path("/etc/apt/sources.list.d/vidcluster-nonfree.sources").exists()
    off = run_playbook(PLAYBOOK, "--check", "--tags", "nvidia-driver", "--skip-tags", "login", inventory=inventory)
    assert "nvidia_driver : " not in off.stdout  # off by default: the role is not even included


def test_one_gpu_query_for_every_role_and_a_broken_driver_fails_the_node(tmp_path: Path) -> None:
    """roles/node_gpus (what python_env and ddp_config both include) on this machine, with nvidia-smi stood in for by
    scripts: two GPUs are listed, no nvidia-smi is no GPU, an nvidia-smi that cannot reach the driver fails, a GPU with
    MIG enabled fails."""
    inventory = tmp_path / "controller.yml"
    inventory.write_text("all:\n  hosts:\n    controller:\n      ansible_connection: local\n"
                         "      ansible_python_interpreter: /usr/bin/python3\n")
    play = tmp_path / "gpus.yml"
    listed = "{{ node_gpus_found | map(attribute='index') | join(',') }}"
    play.write_text("- hosts: controller\n  gather_facts: false\n  tasks:\n"
                    "    - {ansible.builtin.include_role: {name: node_gpus}}\n"
                    f"    - {{ansible.builtin.debug: {{msg: \"GPUS={listed} \"}}}}\n")
    two, broken, mig = tmp_path / "two-gpus", tmp_path / "no-driver", tmp_path / "mig"
    listing = ("echo '0, NVIDIA A100-SXM4-80GB, 535.247.01, 81920 MiB'\n"
               "echo '1, NVIDIA A100-SXM4-80GB, 535.247.01, 81920 MiB'\n")
    modes = "if [ \"$1\" = --query-gpu=index,mig.mode.current ]; then echo '0, Disabled'; echo '1, {}'; exit; fi\n"
    two.write_text("#!/bin/sh\n" + modes.format("Disabled") + listing)
    mig.write_text("#!/bin/sh\n" + modes.format("Enabled") + listing)
    broken.write_text("#!/bin/sh\necho \"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA "
                      "driver.\"\nexit 9\n")
    for script in (two, broken, mig):
        script.chmod(0o755)

    def run(smi: Path, check: bool = True) -> subprocess.CompletedProcess[str]:
        return run_playbook(play, "-e", f"node_gpus_smi={smi}", inventory=inventory, check=check)

    assert "GPUS=0,1 " in run(two).stdout
    assert "GPUS= " in run(tmp_path / "not-installed" / "nvidia-smi").stdout
    failed = run(broken, check=False)
    assert failed.returncode != 0 and "GPUS=" not in failed.stdout
    assert "controller: nvidia-smi failed (rc 9): NVIDIA-SMI has failed because it couldn't communicate" in " ".join(
        failed.stdout.split())
    split = run(mig, check=False)
    assert split.returncode != 0 and "GPUS=" not in split.stdout
    assert "controller: MIG is enabled on GPU 1 NVIDIA A100-SXM4-80GB; VidCluster trains one process per whole GPU" in (
        " ".join(split.stdout.split()))


# --- a real 2-node cluster --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(local_cluster: Any) -> Iterator[LocalCluster]:
    made: LocalCluster = local_cluster(2)
    yield made
    made.destroy()


@pytest.fixture(scope="module")
def per_node(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, ...]:
    """Arguments of a per-node offline install of SMALL_REQUIREMENTS: each node's own ~/vidcluster/venv (private
    homes), from a wheelhouse this module's controller downloads afresh and copies to each node that installs."""
    base = tmp_path_factory.mktemp("python-env")
    requirements = base / "requirements.txt"
    requirements.write_text(SMALL_REQUIREMENTS)
    return (
        "-e", "vidcluster_env_path=~/vidcluster/venv",
        "-e", "python_env_shared_fs=false",
        "-e", f"python_env_requirements_file={requirements}",
        "-e", "python_env_wheelhouse=true",
        "-e", "python_env_wheelhouse_copy=true",
        "-e", f"python_env_wheelhouse_controller_dir={base / 'wheelhouse'}",
        "-e", '{"python_env_decoders": []}',  # these small environments hold no video decoder
    )  # fmt: skip


def test_check_mode_on_fresh_nodes_creates_nothing(cluster: LocalCluster, per_node: tuple[str, ...]) -> None:
    proc = cluster.playbook(PLAYBOOK, "--check", *per_node)
    assert "no environment at /home/vctrain/vidcluster/venv" in proc.stdout
    for node in cluster.nodes:
        assert not (node.home / "vidcluster").exists()


def test_each_node_installs_its_own_environment_offline(cluster: LocalCluster, per_node: tuple[str, ...]) -> None:
    started = time.monotonic()
    proc = cluster.playbook(PLAYBOOK, *per_node)
    print(f"per-node offline install on {len(cluster.nodes)} nodes: {time.monotonic() - started:.0f} s")
    assert task_lines(proc.stdout, PIP_TASK) == [f"changed: [{node.name}]" for node in cluster.nodes]
    probe = (
        "~/vidcluster/venv/bin/python -c 'import sys, yaml, paramiko; "
        "print(sys.prefix, yaml.__version__, paramiko.__version__)'"
    )
    for node in cluster.nodes:
        # Installed with the node's own python, in its own home, from the copied wheelhouse.
        assert cluster.ssh(node, probe).stdout.split() == ["/home/vctrain/vidcluster/venv", "6.0.4", "4.0.0"]
        assert (node.home / "vidcluster" / "venv" / SITE / "paramiko-4.0.0.dist-info").is_dir()
        assert (node.home / "vidcluster" / "wheelhouse" / "paramiko-4.0.0-py3-none-any.whl").is_file()
        assert (node.home / "vidcluster" / "venv" / "vidcluster-requirements.txt").read_text() == SMALL_REQUIREMENTS
        assert re.search(
            rf"^\s*- {node.name}\s+3\.11\.\d+\s+missing(\s+n/a){{3}}(\s+missing){{3}}\s+n/a\s+4\.0\.0\b", proc.stdout,
            re.M,
        )


def test_second_run_changes_nothing_and_does_not_call_pip(cluster: LocalCluster, per_node: tuple[str, ...]) -> None:
    record = cluster.nodes[0].home / "vidcluster" / "venv" / SITE / "paramiko-4.0.0.dist-info" / "RECORD"
    before = record.stat().st_mtime_ns
    started = time.monotonic()
    proc = cluster.playbook(PLAYBOOK, *per_node)
    print(f"second run: {time.monotonic() - started:.0f} s")
    assert changed_total(proc.stdout, cluster.names) == 0
    assert task_lines(proc.stdout, PIP_TASK) == [f"skipping: [{node.name}]" for node in cluster.nodes]
    assert record.stat().st_mtime_ns == before


def test_node_with_a_different_torch_fails_the_setup_naming_it(cluster: LocalCluster, tmp_path: Path) -> None:
    node0, node1 = cluster.nodes
    assert CPU_TORCH is not None, "torch 2.13.0+cpu wheel missing from /opt/wheels"
    # node1's environment: its own venv in its home with the CPU torch 2.13.0 wheel installed by the node's user;
    # the rest of the stack (torch's own dependencies, torchvision, decord, paramiko) comes from the shared one.
    cluster.ssh(node1, (
        f"set -e; /usr/bin/python3 -m venv --without-pip ~/drift/venv; "
        f"echo {SHARED_ENV}/{SITE} > ~/drift/venv/{SITE}/vidcluster-shared.pth; "
        f"{SHARED_ENV}/bin/python -m pip --python ~/drift/venv/bin/python install -q --no-deps --no-index "
        f"--no-compile {CPU_TORCH}"
    ))  # fmt: skip
    assert cluster.ssh(node1, "~/drift/venv/bin/python -c 'import torch; print(torch.__version__)'").stdout.strip() == (
        "2.13.0+cpu"
    )
    drift = tmp_path / "drift.yml"  # a second inventory source: node1's own environment path
    drift.write_text(f"trainers:\n  hosts:\n    {node1.name}:\n      vidcluster_env_path: ~/drift/venv\n")
    # What the role would write into an environment it installs (the nodes could not: it is mounted read-only).
    shared_files = [
        REPO / ".venv" / SITE / "torch-2.14.1.dist-info" / "RECORD",
        REPO / ".venv" / "vidcluster-requirements.txt",
    ]
    shared_before = [path.stat().st_mtime_ns if path.exists() else None for path in shared_files]
    node0_home_before = sorted(p.name for p in node0.home.iterdir())

    proc = cluster.playbook("setup-cluster.yml", "-i", str(drift), check=False)
    assert proc.returncode != 0
    out = proc.stdout
    assert re.search(r"Environments differ between nodes in: torch\b", out), out[-4000:]
    # The full table and the table of differences name node1 with its torch, node0 with the shared one.
    assert re.search(rf"^\s*{node1.name}\s+2\.13\.0\+cpu\b", out, re.M), out[-4000:]
    assert re.search(rf"^\s*{node0.name}\s+2\.14\.1\+cu130\b", out, re.M), out[-4000:]
    assert re.search(rf"^\s*- '?{node1.name}\s+3\.11\.\d+\s+2\.13\.0\+cpu\s", out, re.M), out[-4000:]
    assert f"torch: 2.14.1+cu130 on {node0.name}; 2.13.0+cpu on {node1.name}" in out
    # It failed at the comparison: nothing was installed (the shared environment is verified, never repaired on
    # another node's behalf), and the SSH check after it did not run.
    assert task_lines(out, PIP_TASK) == [f"skipping: [{node.name}]" for node in cluster.nodes]
    assert "TASK [ssh_check" not in out
    # Nothing half-done: node1 keeps its torch, node0 and the shared environment are untouched.
    assert cluster.ssh(node1, f"ls -d ~/drift/venv/{SITE}/torch-*.dist-info").stdout.split() == [
        f"/home/vctrain/drift/venv/{SITE}/torch-2.13.0+cpu.dist-info"
    ]
    assert [path.stat().st_mtime_ns if path.exists() else None for path in shared_files] == shared_before
    assert sorted(p.name for p in node0.home.iterdir()) == node0_home_before
    assert not (node0.home / "drift").exists()


def test_shared_environment_runs_both_decoders(cluster: LocalCluster) -> None:
    torchcodec = metadata.version("torchcodec")
    ffmpeg = subprocess.run(["ffmpeg", "-version"], capture_output=True, text=True, check=True).stdout.split()[2]
    started = time.monotonic()
    proc = cluster.playbook(PLAYBOOK, "-e", '{"python_env_decoders": ["decord", "torchcodec"]}')
    print(f"shared environment with both decoders: {time.monotonic() - started:.0f} s")
    # This host's FFmpeg libraries are every node's: found, so nothing is installed (and no become is needed).
    assert task_lines(proc.stdout, "Install FFmpeg's shared libraries for torchcodec") == [
        f"skipping: [{node.name}]" for node in cluster.nodes
    ]
    assert task_lines(proc.stdout, "Check that the node can run the chosen video decoders") == [
        f"ok: [{node.name}]" for node in cluster.nodes
    ]
    for node in cluster.nodes:  # ... decord, torchcodec, ffmpeg, paramiko in the table
        assert re.search(rf"^\s*- '?{node.name}\s.*\s0\.6\.0\s+{re.escape(torchcodec)}\S*\s+{re.escape(ffmpeg)}\s",
                         proc.stdout, re.M), proc.stdout[-4000:]
    assert all(recap(proc.stdout)[node.name]["changed"] == 0 for node in cluster.nodes)


def test_the_chosen_torch_build_is_what_every_node_compares_against(cluster: LocalCluster) -> None:
    # Check mode: PyTorch's index is out of reach here, and the shared environment holds the PyPI (cu130) build.
    proc = cluster.playbook(PLAYBOOK, "--check", "-e", "vidcluster_torch_build=cu126")
    assert "torch==2.14.1+cu126 (installed 2.14.1)" in flat(proc.stdout), proc.stdout[-3000:]
    assert "torchvision==0.29.1+cu126 (installed 0.29.1)" in flat(proc.stdout)
    wrong = cluster.playbook(PLAYBOOK, "-e", "vidcluster_torch_build=cu999", check=False)
    assert wrong.returncode != 0
    assert (f"{cluster.nodes[0].name}: vidcluster_torch_build 'cu999' is not one of python_env_torch_builds (cu126, "
            "cu130, cu132, cpu)") in flat(wrong.stdout)
    assert "TASK [python_env : Query the GPUs" not in wrong.stdout  # refused before anything else ran
