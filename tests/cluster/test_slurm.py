"""A Slurm site, on one local Slurm cluster (playbooks/local-cluster.yml -e slurm=true: Debian's slurmctld on this
machine, one slurmd per namespace host, munge, a login host, a shared home) that every scenario shares:
  - the cluster itself: its daemons are its own, jobs submitted from the login host run on its compute nodes, a
    second run changes nothing, and state=absent leaves nothing behind (last);
  - the trainer under a plain srun takes its ranks from the allocation, and stops with one line where scontrol
    cannot give it the rank-0 node;
  - setup-cluster.yml: no SSH mesh (it says why), the environment proven on the compute nodes by a Slurm job and
    compared with the login host's; a job the site cannot run is named with Slurm's words.
Slow (a Slurm cluster and whole jobs): the slow lane, `bash scripts/test.sh --slow`.
"""

from __future__ import annotations

import json
import re
import shutil
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
    flat,
    link_names,
    netns_names,
    run_playbook,
)

pytestmark = pytest.mark.slow

COMPUTE = 3  # compute nodes; the cluster has one more host, its login host


@pytest.fixture(scope="module")
def cluster(local_cluster: Callable[..., LocalCluster]) -> Iterator[LocalCluster]:
    made = local_cluster(COMPUTE, "-e", "slurm=true")
    yield made
    made.destroy()


def login(cluster: LocalCluster) -> Node:
    return next(node for node in cluster.nodes if node.name == "login")


def compute(cluster: LocalCluster) -> list[Node]:
    return [node for node in cluster.nodes if node.name != "login"]


def on_login(cluster: LocalCluster, command: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """A command on the login host, as the cluster user (Slurm's commands find the cluster's /etc/slurm there)."""
    return cluster.ssh(login(cluster), command, check=check)


def pid_of(path: Path) -> int:
    return int(path.read_text().strip())


def cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]


def test_the_daemons_are_the_clusters_own_and_jobs_run_on_its_compute_nodes(cluster: LocalCluster) -> None:
    slurm = cluster.state_dir / "slurm"
    ctld, munged = pid_of(slurm / "slurmctld.pid"), pid_of(slurm / "munged.pid")
    assert cmdline(ctld)[-2:] == ["-f", str(cluster.slurm_conf)]
    assert f"--socket=/run/vidcluster/slurm-{cluster.name}/munge.socket" in cmdline(munged)
    port = re.search(r"^SlurmctldPort=(\d+)$", cluster.slurm_conf.read_text(), re.M)
    assert port is not None and 17000 <= int(port[1]) < 18000  # the cluster's own, from its name
    for node in compute(cluster):  # one slurmd per compute node, in that node's network namespace
        pid = pid_of(node.dir / "slurmd.pid")
        assert cmdline(pid)[-2:] == ["-N", node.name]
        ns = subprocess.run(["ip", "netns", "identify", str(pid)], capture_output=True, text=True, check=True)
        assert ns.stdout.strip() == node.netns
    assert not (login(cluster).dir / "slurmd.pid").exists()
    out = on_login(cluster, "sinfo --noheader --Node --format='%N %t %P'; "
                            "sbatch --wait --nodes=2 --output=job-%j.out --wrap='srun hostname -I'").stdout
    assert sorted(out.splitlines()[:COMPUTE]) == [f"{n.name} idle vc*" for n in compute(cluster)], out
    job = re.search(r"Submitted batch job (\d+)", out)
    assert job is not None, out
    # The batch script ran in the shared home, its step on two compute nodes (their own addresses).
    ran = (login(cluster).home / f"job-{job[1]}.out").read_text().split()
    assert sorted(ran)[:2] == sorted(n.ip for n in compute(cluster)[:2]) and len(ran) == 4  # IPv4 and IPv6 each
    assert f"JobId={job[1]} " in (slurm / "jobcomp.log").read_text()  # Slurm's completion log has the job


def ship_entry(cluster: LocalCluster) -> Path:
    """The trainer and tests/trainer/_dist_entry.py in the shared home (what a user's code looks like on a Slurm
    site), with a config of 3 CPU workers per node that srun must overrule; the folder as the nodes see it."""
    folder = login(cluster).home / "srun-entry"
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(REPO / "trainer", folder / "trainer", ignore=shutil.ignore_patterns("__pycache__"))
    (folder / "out").mkdir()
    shutil.copy(REPO / "tests" / "trainer" / "_dist_entry.py", folder / "entry.py")
    config = {"DDP_CONFIG": {"AUTO_RANK_MATCH": False, "WORLD_SIZE": 1, "WORLD_RANK": 0,
                             "DIST_URL": "tcp://127.0.0.1:1", "WOLRD_URLS": ["127.0.0.1"], "DIST_BACKEND": "gloo",
                             "DISTRIBUTED": True, "CPU_WORKERS": 3, "TIMEOUT_SECONDS": 60},
              "CONFIG": {"LOG": {"BASE_PATH": "/home/vctrain/srun-entry/out", "EXP_NAME": ""}}}
    (folder / "config.yaml").write_text(json.dumps(config))
    shutil.chown(folder, "vctrain", "vctrain")
    for path in folder.rglob("*"):
        shutil.chown(path, "vctrain", "vctrain")
    return Path("/home/vctrain/srun-entry")


def test_a_trainer_under_a_plain_srun_takes_its_ranks_from_the_allocation(cluster: LocalCluster) -> None:
    folder = ship_entry(cluster)
    # Two nodes, one task each; no MASTER_ADDR: the rank-0 node's address comes from scontrol.
    out = on_login(cluster, f"cd {folder} && GLOO_SOCKET_IFNAME=eth0 PYTHONPATH=$PWD srun --nodes=2 "
                            "--ntasks-per-node=1 --output=srun-%j-%t.out /opt/vidcluster/venv/bin/python entry.py "
                            "--config-file config.yaml; echo status $?")
    assert "status 0" in out.stdout, out.stdout + out.stderr
    (task0,) = (login(cluster).home / "srun-entry").glob("srun-*-0.out")
    job_id = task0.name.split("-")[1]
    shown = on_login(cluster, f"scontrol --oneliner show job {job_id}").stdout
    assert " NodeList=node[0-1] " in shown, shown
    records = [json.loads((login(cluster).home / "srun-entry" / "out" / f"rank{r}.json").read_text())
               for r in (0, 1)]
    assert [(r["rank"], r["world_size"], r["node_rank"], r["local_world_size"]) for r in records] == [
        (0, 2, 0, 1), (1, 2, 1, 1)]  # one worker per task (not the config's 3), ranks in the allocation's order
    # The rendezvous: the first allocated node's NodeAddr, at the job's port.
    assert {r["dist_url"] for r in records} == {f"tcp://{compute(cluster)[0].ip}:{15000 + int(job_id) % 10000}"}


def test_a_trainer_under_srun_without_scontrol_stops_with_one_line(cluster: LocalCluster) -> None:
    folder = ship_entry(cluster)
    out = on_login(cluster, f"cd {folder} && PYTHONPATH=$PWD srun --nodes=2 --ntasks-per-node=1 "
                            "env PATH=/opt/vidcluster/venv/bin python -m trainer.train --config-file config.yaml; "
                            "echo status $?", check=False)
    assert "status 2" in out.stdout, out.stdout + out.stderr
    errors = [line for line in out.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 2 and "scontrol is not on PATH" in errors[0], out.stderr  # one line per task
    assert "Traceback" not in out.stderr


def test_setup_cluster_proves_the_environment_on_the_compute_nodes_through_a_slurm_job(cluster: LocalCluster) -> None:
    out = flat(cluster.playbook("setup-cluster.yml").stdout)
    assert "Slurm site: no SSH key mesh and no all-pairs SSH check" in out
    # The login host's environment and every node of a job's size in one table, as over SSH.
    table = out.split("Show the environment of the login host and every compute node", 1)[1]
    for name in ("login", "node0", "node1"):
        assert re.search(rf"- {name} 3\.11\.\d+ 2\.14\.1", table), table[:2000]
    completed = (cluster.state_dir / "slurm" / "jobcomp.log").read_text()
    assert re.search(r"Name=vidcluster-env JobState=COMPLETED .* NodeCnt=2 ", completed), completed
    assert [p.name for p in (login(cluster).home / ".ssh").iterdir()] == ["authorized_keys"]  # no cluster key, no mesh
    # A job the site cannot run is named with Slurm's own words (this cluster has no GPUs to give).
    refused = cluster.playbook("setup-cluster.yml", "--tags", "env", "-e", "vidcluster_slurm_gpus_per_node=1",
                               check=False)
    assert refused.returncode != 0
    assert "The Slurm job that checks the environment on the compute nodes did not run (srun: error: " in flat(
        refused.stdout), refused.stdout[-3000:]


def test_a_second_run_changes_nothing(cluster: LocalCluster) -> None:
    proc = run_playbook(CLUSTER_PLAYBOOK, "-e", f"nodes={COMPUTE}", "-e", f"cluster_name={cluster.name}",
                        "-e", "slurm=true")
    assert changed_total(proc.stdout, ["localhost"]) == 0, proc.stdout[-3000:]


def test_teardown_is_complete(cluster: LocalCluster) -> None:
    # Runs last in this module: the playbook alone (no force-delete) must leave nothing behind.
    slurm = cluster.state_dir / "slurm"
    daemons = [pid_of(slurm / "slurmctld.pid"), pid_of(slurm / "munged.pid"),
               *(pid_of(node.dir / "slurmd.pid") for node in compute(cluster))]
    run_playbook(CLUSTER_PLAYBOOK, "-e", f"cluster_name={cluster.name}", "-e", "state=absent")
    assert not any(Path(f"/proc/{pid}").exists() for pid in daemons)
    assert not netns_names(cluster.name) and not link_names(cluster.name)
    assert not Path(f"/run/vidcluster/slurm-{cluster.name}").exists()
    assert not cluster.state_dir.exists()
