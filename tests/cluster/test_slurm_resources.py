"""What a Slurm job's one task per node gets (roles/cluster_inventory's contract, trainer/runtime/slurm/login.py's
batch script, trainer/runtime/slurm/allocation.py's steps): the node's CPUs and memory by default, since that task runs
every trainer of the node and their loaders; the settings that say otherwise, each refused by name when malformed. Fast:
the sample inventory read by ansible-inventory, the contract and the batch script as the launch renders them; no Slurm
cluster (the slow lane's tests/cluster/test_slurm.py runs a job with these options)."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from tests.cluster.conftest import REPO, load_file
from tests.runtime.test_plan import job, plans
from tests.runtime.test_slurm import HOMES
from trainer.runtime.slurm.allocation import step_cpus
from trainer.runtime.slurm.login import batch_script

contract = load_file(REPO / "roles" / "cluster_inventory" / "filter_plugins" / "cluster_inventory.py")
SAMPLE = REPO / "inventory" / "sample-slurm" / "hosts.yml"
LOGIN_DIR = "/home/u/vidcluster/jobs/k400-a/login"


def login_row(**slurm: Any) -> dict[str, Any]:
    return {"name": "login", "group": "slurm_submit", "scheduler": "slurm", "user": "trainer",
            "slurm": {"vidcluster_slurm_nodes": 2, "vidcluster_slurm_gpus_per_node": 8, **slurm}}


def sbatch_lines(settings: dict[str, Any]) -> list[str]:
    """The #SBATCH options of the batch script slurm-submit writes for these checked settings (as submit.yml passes
    them)."""
    options = {"trainers": settings["nodes"], "spares": settings["spares"], "time": settings["time"],
               "signal_seconds": settings["signal_seconds"], "site_options": settings["site_options"], "iface": ""}
    script = batch_script(plans(job(HOMES))["n0"], LOGIN_DIR, options)
    return [line.removeprefix("#SBATCH ") for line in script.splitlines() if line.startswith("#SBATCH ")]


def test_the_sample_inventorys_batch_script_gives_each_nodes_task_the_whole_node() -> None:
    shown = subprocess.run([str(REPO / ".venv" / "bin" / "ansible-inventory"), "-i", str(SAMPLE), "--host", "login1"],
                           cwd=REPO, capture_output=True, text=True, check=True, timeout=120).stdout
    given = {key: value for key, value in json.loads(shown).items() if key.startswith("vidcluster_slurm_")}
    checked = contract.scheduler_contract([{**login_row(), "slurm": given}])
    assert checked["errors"] == []
    asked = sbatch_lines(checked["slurm"])
    # One task per node (the supervisor: every trainer of the node and their loaders) with all the node's CPUs and
    # memory; no --cpus-per-task of 1 left for the site to pick.
    assert "--ntasks-per-node=1" in asked and "--exclusive" in asked and "--mem=0" in asked
    assert not [option for option in asked if option.startswith(("--cpus-per-task", "--mem-per"))]
    assert "--gres=gpu:8" in asked and not [option for option in asked if option.startswith("--gpu")]


def test_the_settings_ask_cpus_memory_and_gpus_as_the_site_wants() -> None:
    checked = contract.scheduler_contract([login_row(
        vidcluster_slurm_cpus_per_task="48", vidcluster_slurm_mem="500G", vidcluster_slurm_gpus_per_task="true",
        vidcluster_slurm_gpu_bind="none")])
    assert checked["errors"] == []
    assert checked["slurm"]["site_options"] == ["--gpus-per-task=8", "--gpu-bind=none", "--cpus-per-task=48",
                                                "--mem=500G"]
    assert sbatch_lines(checked["slurm"])[-4:] == checked["slurm"]["site_options"]
    # The site's default memory: no --mem at all.
    assert contract.scheduler_contract([login_row(vidcluster_slurm_mem="")])["slurm"]["site_options"] == [
        "--gres=gpu:8", "--exclusive"]


def test_every_srun_step_is_told_the_jobs_cpus_per_task() -> None:
    """Slurm 22.05 to 23.02 does not pass the job's --cpus-per-task on to srun: the batch step says it again."""
    assert step_cpus({"SLURM_CPUS_PER_TASK": "48"}) == ["--cpus-per-task=48"]
    assert step_cpus({"SLURM_CPUS_ON_NODE": "64"}) == []  # whole nodes: a step gets all of the job's CPUs


@pytest.mark.parametrize(
    ("slurm", "message"),
    [
        ({"vidcluster_slurm_cpus_per_task": "many"},
         "vidcluster_slurm_cpus_per_task 'many' is not 'all' (whole nodes) or a whole number >= 1"),
        ({"vidcluster_slurm_cpus_per_task": 0}, "vidcluster_slurm_cpus_per_task 0 is not 'all'"),
        ({"vidcluster_slurm_mem": "lots"}, "vidcluster_slurm_mem 'lots' is not a Slurm memory size"),
        ({"vidcluster_slurm_gpus_per_task": "yes"}, "vidcluster_slurm_gpus_per_task 'yes' is not true or false"),
        ({"vidcluster_slurm_gpus_per_task": True, "vidcluster_slurm_gpus_per_node": 0},
         "vidcluster_slurm_gpus_per_task is true but vidcluster_slurm_gpus_per_node asks no GPU"),
        ({"vidcluster_slurm_gpu_bind": "map gpu"}, "vidcluster_slurm_gpu_bind 'map gpu' is not one --gpu-bind value"),
        ({"vidcluster_slurm_sbatch_extra": ["--exclusive"]},
         "item '--exclusive': --exclusive is set by vidcluster_slurm_cpus_per_task"),
        ({"vidcluster_slurm_sbatch_extra": ["--mem-per-cpu=4G"]},
         "item '--mem-per-cpu=4G': --mem-per-cpu is set by vidcluster_slurm_mem"),
        ({"vidcluster_slurm_sbatch_extra": ["--gpus-per-task=1"]},
         "--gpus-per-task is set by vidcluster_slurm_gpus_per_node"),
    ],
    ids=["cpus-word", "cpus-zero", "mem-word", "per-task-word", "per-task-no-gpus", "bind-space", "extra-exclusive",
         "extra-mem", "extra-gpus-per-task"],
)
def test_each_malformed_resource_setting_is_named(slurm: dict[str, Any], message: str) -> None:
    errors = contract.scheduler_contract([login_row(**slurm)])["errors"]
    assert any(message in error for error in errors), errors
