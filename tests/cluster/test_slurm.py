"""A Slurm site, on one local Slurm cluster (playbooks/local-cluster.yml -e slurm=true: Debian's slurmctld on this
machine, one slurmd per namespace host, munge, a login host, a shared home) that every scenario shares, in order:
  - the cluster itself: its daemons are its own, jobs submitted from the login host run on its compute nodes, a
    second run changes nothing (while the first job runs), and state=absent leaves nothing behind (last);
  - the trainer under a plain srun takes its ranks from the allocation, and stops with one line where scontrol
    cannot give it the rank-0 node;
  - setup-cluster.yml: no SSH mesh (it says why), the environment proven on the compute nodes by a Slurm job and
    compared with the login host's; a job the site cannot run is named with Slurm's words;
  - launch-training.yml (2 nodes, gloo, heartbeat timeout 10 s): a job trains to the end with the allocation's
    ranks (the reference: its final weights); beside it, a trainer killed restarts in the same allocation (no
    requeue) with the reference's weights; a node lost with a spare in the allocation: the spare takes its rank, no
    requeue; a node lost without one, 3 trainers and vidcluster_min_nodes=2: the world shrinks inside the allocation,
    no requeue; a node lost without a spare, 2 trainers: Slurm requeues the job, which resumes and finishes; a time
    limit shorter than the training: every rank checkpoints at one step, the job requeues and loses no step;
    training-status.yml shows the queue and the progress, stop-training.yml stops the job at a checkpoint and it
    leaves the queue.
Slurm's view of each job: scontrol (its Restarts) and its completion log (jobcomp/filetxt: one line per run of a job,
requeued runs included; this cluster has no accounting database for sacct).
Slow (a Slurm cluster and whole jobs): the slow lane, `bash scripts/test.sh --slow`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.cluster.conftest import (
    CLUSTER_PLAYBOOK,
    FAST_JOB_ARGS,
    REPO,
    LocalCluster,
    Node,
    changed_total,
    cpu_quota,
    finish,
    flat,
    link_names,
    netns_names,
    playbook_env,
    run_playbook,
    signal_netns,
    trainer_pid,
)
from trainer.runtime.layout import STOP_REQUEST_FILE

pytestmark = pytest.mark.slow

COMPUTE = 5  # compute nodes (a lost one is not brought back); the cluster has one more host, its login host
CONFIG = "i3d_cpu_test"
LAUNCH_ARGS = ("-e", f"config={CONFIG}", *FAST_JOB_ARGS)


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


def running(pid: int) -> list[str]:
    """The process's command line; empty once it is gone (a zombie's too: nothing of it runs)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]
    except FileNotFoundError:
        return []


def running_daemons(cluster: LocalCluster) -> dict[int, list[str]]:
    """The cluster's daemons that run now, by recorded pid and what each runs: a lost node's slurmd is gone and its
    recorded pid may since be another process's (pids wrap at 32768 on a busy machine)."""
    slurm = cluster.state_dir / "slurm"
    ctld, munged = pid_of(slurm / "slurmctld.pid"), pid_of(slurm / "munged.pid")
    found = {ctld: running(ctld), munged: running(munged)}
    found = {pid: line for pid, line in found.items()
             if line[-2:] == ["-f", str(cluster.slurm_conf)]
             or f"--socket=/run/vidcluster/slurm-{cluster.name}/munge.socket" in line}
    for node in compute(cluster):
        pid = pid_of(node.dir / "slurmd.pid")
        ns = subprocess.run(["ip", "netns", "identify", str(pid)], capture_output=True, text=True).stdout.strip()
        if (line := running(pid))[-2:] == ["-N", node.name] and ns == node.netns:
            found[pid] = line
    return found


def test_the_daemons_are_the_clusters_own_and_jobs_run_on_its_compute_nodes(cluster: LocalCluster) -> None:
    slurm = cluster.state_dir / "slurm"
    # slurmctld and munged with this cluster's configuration; one slurmd per compute node, in its network namespace
    assert len(running_daemons(cluster)) == 2 + COMPUTE, running_daemons(cluster)
    port = re.search(r"^SlurmctldPort=(\d+)$", cluster.slurm_conf.read_text(), re.M)
    assert port is not None and 17000 <= int(port[1]) < 18000  # the cluster's own, from its name
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
              "CONFIG": {"LOG": {"BASE_PATH": "/home/vctrain/srun-entry/out", "EXP_NAME": ""},
                         "DATA": {"DECODE_TIME_LIMIT": 30}}}  # below TIMEOUT_SECONDS, as the config requires
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


# --- launch-training.yml on the Slurm site ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def dataset(cluster: LocalCluster) -> Path:
    """configs/i3d_cpu_test.yaml's small two-class H.264 dataset, made in the shared home (a Slurm site's data is
    on its shared filesystem; stage-data.yml is for SSH clusters)."""
    data = login(cluster).home / "data" / "vidcluster-test"
    subprocess.run(
        [str(REPO / ".venv" / "bin" / "python"), "-m", "trainer", "make-dataset", str(data), "--classes", "left",
         "right", "--train-per-class", "8", "--val-per-class", "4", "--size", "32", "--frames", "16"],
        cwd=REPO, check=True, capture_output=True, text=True,
    )  # fmt: skip
    for path in [data.parent, data, *data.rglob("*")]:
        shutil.chown(path, "vctrain", "vctrain")
    return data


def launch(cluster: LocalCluster, job: str, epochs: int, *args: str) -> subprocess.Popen[str]:
    overrides = {"ddp_config_overrides": {"CONFIG": {"TRAIN": {"EPOCH_NUM": epochs, "CHECKPOINT_MINUTES": 0.1}}}}
    return subprocess.Popen(
        [str(REPO / ".venv" / "bin" / "ansible-playbook"), "-i", str(cluster.inventory), "launch-training.yml",
         *LAUNCH_ARGS, "-e", f"job_id={job}", "-e", json.dumps(overrides), *args],
        cwd=REPO, env=playbook_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def job_dir(cluster: LocalCluster, job: str) -> Path:
    return login(cluster).home / "vidcluster" / "jobs" / job


def run_status(cluster: LocalCluster, job: str) -> dict:
    """The trainer's status.json (the run directory is in the shared home)."""
    try:
        return json.loads((job_dir(cluster, job) / "run" / "status.json").read_text())
    except (OSError, ValueError):
        return {}


def node_logs(cluster: LocalCluster, job: str) -> str:
    """The last lines of every node's train.log of the job (what a failure's message shows)."""
    return "\n".join(f"{log.parent.name}: ...{log.read_text()[-1500:]}"
                     for log in sorted(job_dir(cluster, job).glob("*/train.log")))


def wait_for_epoch(cluster: LocalCluster, job: str, epoch: int, play: subprocess.Popen[str] | None) -> None:
    deadline = time.monotonic() + 300
    while run_status(cluster, job).get("epoch", 0) < epoch:
        if play is not None and play.poll() is not None:
            pytest.fail(f"the play ended early:\n{play.communicate()[0][-4000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"{job} did not reach epoch {epoch}")
        time.sleep(0.3)


def account(cluster: LocalCluster, job: str) -> dict:
    """The batch step's account of the job (trainer/runtime/slurm/account.py: every allocation, the outcome)."""
    return json.loads((job_dir(cluster, job) / "login" / "slurm.json").read_text())


def final_record(cluster: LocalCluster, job: str) -> dict:
    """The job's record as its hub in the last allocation kept it."""
    hub = account(cluster, job)["allocations"][-1]["members"][0]
    return json.loads((job_dir(cluster, job) / hub / "state.json").read_text())["record"]


def slurm_view(cluster: LocalCluster, job: str) -> tuple[str, list[str]]:
    """(scontrol's line of the job's Slurm job, the lines Slurm's completion log has of its runs: one per run, a
    requeued one included; a node removed from a running job's allocation (--no-kill) logs a RESIZING line, which is
    not a run)."""
    slurm_job = account(cluster, job)["slurm_job"]
    shown = on_login(cluster, f"scontrol --oneliner show job {slurm_job}").stdout
    runs = [line for line in (cluster.state_dir / "slurm" / "jobcomp.log").read_text().splitlines()
            if line.startswith(f"JobId={slurm_job} ") and " JobState=RESIZING " not in line]
    return shown, runs


def digest(job: str) -> str:
    found = json.loads((REPO / "runs" / job / "weights_digest.json").read_text())
    assert found["identical"], found
    return found["digests"][0]


def attempts(job: str) -> list[dict]:
    """metrics.jsonl's records of restarted attempts (the run's copy on the controller)."""
    lines = (REPO / "runs" / job / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if '"attempt"' in line]


def lose(node: Node) -> None:
    """Every process of the node's namespace (its slurmd, sshd, supervisor and trainer): the machine is gone."""
    signal_netns(node.netns, signal.SIGKILL)


def wait_until_slurm_gives_it_no_job(cluster: LocalCluster, node: Node) -> None:
    """Slurm notices a node that stopped answering after its SlurmdTimeout ("*": not responding; then down, or left
    completing the job it had) and gives it no job from then on: the next scenario must not be given it."""
    deadline = time.monotonic() + 90
    while not on_login(cluster, f"sinfo --noheader --nodes={node.name} --format=%t").stdout.strip().endswith("*"):
        assert time.monotonic() < deadline, f"Slurm did not notice that {node.name} stopped answering"
        time.sleep(2)


EPOCHS = 6


@pytest.fixture(scope="module")
def reference(cluster: LocalCluster, dataset: Path) -> dict:
    """An uninterrupted 2-node job (its final weights, and how long an epoch took: to size the time-limit job) and,
    side by side with it, the same job whose rank-1 trainer is killed at epoch 2 (two jobs at once: a quicker
    module)."""
    job, killed = f"{cluster.name}-ref", f"{cluster.name}-kill"
    play, kill_play = launch(cluster, job, EPOCHS), launch(cluster, killed, EPOCHS)
    # Meanwhile, while every node is whole and jobs run: a second run of the cluster's playbook changes nothing.
    again = subprocess.Popen([str(REPO / ".venv" / "bin" / "ansible-playbook"), str(CLUSTER_PLAYBOOK), "-e",
                              f"nodes={COMPUTE}", "-e", f"cluster_name={cluster.name}", "-e", "slurm=true"],
                             cwd=REPO, env=playbook_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    # One loop watches both: the reference's epochs are timed while the other job's rank 1 is killed at epoch 2.
    started, timed, node1, deadline = None, None, None, time.monotonic() + 300
    while (epoch := run_status(cluster, job).get("epoch", 0)) < EPOCHS - 1 or node1 is None:
        if epoch >= EPOCHS - 1 and started is not None:
            timed = timed or (time.monotonic() - started) / (EPOCHS - 2)
        for what, ended in ((job, play.poll() is not None and epoch < EPOCHS - 1),
                            (killed, kill_play.poll() is not None and node1 is None)):
            assert not ended, f"{what}'s play ended early:\n{finish(play)[-3000:]}{finish(kill_play)[-3000:]}"
        assert time.monotonic() < deadline, f"{job} did not reach epoch {EPOCHS - 1}, or {killed} epoch 2"
        started = started or (time.monotonic() if epoch >= 1 else None)
        if node1 is None and run_status(cluster, killed).get("epoch", 0) >= 2:
            node1 = next(n for n in compute(cluster) if final_record(cluster, killed)["assignment"].get(n.name) == 1)
            victim = trainer_pid(killed, node1.name)
            affinity = os.sched_getaffinity(victim)  # the CPUs the trainer (and its loaders) may run on
            os.kill(victim, signal.SIGKILL)
        time.sleep(0.3)
    assert started is not None
    epoch_s = timed or (time.monotonic() - started) / (EPOCHS - 2)
    out = finish(play)
    assert f"Job {job} finished" in flat(out), out[-4000:]
    assert "Job " + job + " submitted as Slurm job" in flat(out)
    kill_out = finish(kill_play)
    return {"job": job, "digest": digest(job), "out": out, "epoch_s": epoch_s, "second_run": finish(again),
            "killed": {"job": killed, "node": node1.name, "out": kill_out, "rc": kill_play.returncode},
            "trainer_cpus": len(affinity)}


def test_a_second_run_of_the_clusters_playbook_changes_nothing(reference: dict) -> None:
    assert changed_total(reference["second_run"], ["localhost"]) == 0, reference["second_run"][-3000:]


def test_a_two_node_job_trains_to_the_end_with_the_allocations_ranks(cluster: LocalCluster, reference: dict) -> None:
    job = reference["job"]
    shown, runs = slurm_view(cluster, job)
    nodes = re.search(r" NodeList=(\S+) ", shown)
    assert nodes is not None and " Restarts=0 " in shown and " JobState=COMPLETED " in shown, shown
    assert len(runs) == 1 and " JobState=COMPLETED " in runs[0]
    names = on_login(cluster, f"scontrol show hostnames {nodes[1]}").stdout.split()
    # Each node's one task (its supervisor, trainers and loaders) was given the whole node: both of its CPUs
    # (--exclusive), not the one CPU a task per node gets by default; a trainer runs on more than one. (This
    # cluster's Slurm does not confine tasks, TaskPlugin=task/none: the affinity shows that nothing else narrows it.)
    cpus = re.search(r" NumCPUs=(\d+) ", shown)
    assert cpus is not None and int(cpus[1]) == 2 * len(names), shown
    assert reference["trainer_cpus"] > 1
    batch_host = re.search(r" BatchHost=(\S+) ", shown)
    assert batch_host is not None
    # The allocation's first node (the batch host) is rank 0 and the hub, the other rank 1, each at its NodeAddr.
    expected = [batch_host[1], *(n for n in names if n != batch_host[1])]
    record = final_record(cluster, job)
    assert sorted(record["assignment"], key=record["assignment"].get) == expected and record["restarts"] == 0
    addrs = {n.name: n.ip for n in compute(cluster)}
    assert record["world_urls"] == [addrs[name] for name in expected]
    plan = json.loads((job_dir(cluster, job) / expected[1] / "plan.json").read_text())
    assert plan["env"]["GLOO_SOCKET_IFNAME"] == "eth0" and "SLURM_PROCID" not in plan["env"]
    # The follow read the queue, then the run's progress, through the same action plugin.
    assert f"{job}: running: epoch" in reference["out"] and f"{job}: finished: epoch {EPOCHS}/{EPOCHS}" in (
        reference["out"])


def test_a_killed_trainer_restarts_in_the_same_allocation(cluster: LocalCluster, reference: dict) -> None:
    job, node1 = reference["killed"]["job"], reference["killed"]["node"]
    assert reference["killed"]["rc"] == 0, reference["killed"]["out"][-4000:]
    record = final_record(cluster, job)
    cause = record["attempts"][1]["cause"]
    assert record["restarts"] == 1 and (cause["node"], cause["kind"]) == (node1, "killed")
    shown, runs = slurm_view(cluster, job)
    assert " Restarts=0 " in shown and len(runs) == 1, (shown, runs)  # one run of the job: no requeue
    (restarted,) = attempts(job)
    assert restarted["restart_s"] < 60 and restarted["steps_lost"] is not None and restarted["steps_lost"] >= 0
    assert digest(job) == reference["digest"]  # resumed exactly, as over SSH


def test_a_lost_node_is_replaced_by_the_spare_in_the_allocation(cluster: LocalCluster, reference: dict) -> None:
    job = f"{cluster.name}-spare"
    play = launch(cluster, job, EPOCHS, "-e", "vidcluster_slurm_spares=1")
    wait_for_epoch(cluster, job, 2, play)
    record = final_record(cluster, job)
    rank1 = next(n for n in compute(cluster) if record["assignment"].get(n.name) == 1)
    spare = account(cluster, job)["allocations"][-1]["members"][2]
    lose(rank1)
    out = finish(play)
    assert play.returncode == 0, out[-4000:]
    record = final_record(cluster, job)
    assert record["assignment"][spare] == 1 and rank1.name in record["lost"]  # the spare took its rank
    shown, runs = slurm_view(cluster, job)
    assert " Restarts=0 " in shown and len(runs) == 1, (shown, runs)
    assert digest(job) == reference["digest"]
    wait_until_slurm_gives_it_no_job(cluster, rank1)


def test_a_lost_node_without_a_spare_shrinks_the_world_inside_the_allocation(cluster: LocalCluster,
                                                                              dataset: Path) -> None:
    """Three trainers, no spare, vidcluster_min_nodes=2: a node lost leaves the world and the other two go on from
    memory in the same allocation (one Slurm run, no requeue), to the end."""
    job = f"{cluster.name}-shrink"
    play = launch(cluster, job, EPOCHS, "-e", "vidcluster_slurm_nodes=3", "-e", "vidcluster_min_nodes=2")
    wait_for_epoch(cluster, job, 2, play)
    record = final_record(cluster, job)
    rank2 = next(n for n in compute(cluster) if record["assignment"].get(n.name) == 2)
    lose(rank2)
    out = finish(play)
    assert play.returncode == 0 and f"Job {job} finished" in flat(out), out[-4000:]
    record = final_record(cluster, job)
    assert len(record["assignment"]) == 2 and rank2.name not in record["assignment"], record["assignment"]
    [change] = record["world_changes"]
    assert (change["left"], change["before"], change["after"], change["cause"]) == ([rank2.name], 3, 2, "lost")
    assert len(account(cluster, job)["allocations"]) == 1
    shown, runs = slurm_view(cluster, job)
    assert " Restarts=0 " in shown and len(runs) == 1 and " JobState=COMPLETED " in runs[-1], (shown, runs)
    (restarted,) = attempts(job)
    assert restarted["resumed_from"] == "memory" and restarted["steps_lost"] == 0, restarted
    wait_until_slurm_gives_it_no_job(cluster, rank2)


def test_a_lost_node_without_a_spare_requeues_the_job_which_resumes(cluster: LocalCluster, reference: dict) -> None:
    job = f"{cluster.name}-requeue"
    play = launch(cluster, job, EPOCHS)
    wait_for_epoch(cluster, job, 2, play)
    first = account(cluster, job)["allocations"][0]["members"]
    rank1 = next(n for n in compute(cluster) if n.name == first[1])
    lose(rank1)
    out = finish(play)
    assert play.returncode == 0, out[-4000:]
    allocations = account(cluster, job)["allocations"]
    assert len(allocations) == 2 and allocations[0]["ended"]["action"] == "requeue"
    assert rank1.name not in allocations[1]["members"]
    shown, runs = slurm_view(cluster, job)
    assert " Restarts=1 " in shown and len(runs) == 2 and " JobState=COMPLETED " in runs[-1], (shown, runs)
    cause = final_record(cluster, job)["attempts"][-1]["cause"]
    assert (cause["node"], cause["kind"]) == (rank1.name, "lost")
    assert f"{job}: " in out and f"{rank1.name} lost" in out  # the follow saw the loss and the restart
    assert json.loads((REPO / "runs" / job / "status.json").read_text())["state"] == "finished"
    assert digest(job) == reference["digest"]
    wait_until_slurm_gives_it_no_job(cluster, rank1)


def as_admin(cluster: LocalCluster, *args: str) -> str:
    """A Slurm command as the site's administrator (root on this machine, the controller's)."""
    return subprocess.run(list(args), env={**os.environ, "SLURM_CONF": str(cluster.slurm_conf)}, check=True,
                          capture_output=True, text=True).stdout


def test_a_time_limit_shorter_than_the_training_requeues_without_losing_a_step(cluster: LocalCluster,
                                                                              reference: dict) -> None:
    # Slurm's smallest limit (1 minute), the signal asked 20 s before it; Slurm looks every 30 s, so it comes 40 to
    # 70 s into a run, 20 s at least before Slurm's kill (with 10 s, a loaded machine's stop and requeue did not
    # always beat the kill). However fast this machine trains, the first run must still be training then, and must have
    # trained a step: once its first epoch is done every compute node is held to a sliver of a CPU (a slow fleet)
    # until the signal's stop request reaches a node, which then checkpoints at full speed before Slurm's kill. Once
    # requeued, the administrator lifts the limit, so that the second run finishes whatever this machine's speed.
    job = f"{cluster.name}-limit"
    epochs = max(EPOCHS, round(40 / reference["epoch_s"]))
    play = launch(cluster, job, epochs, "-e", "vidcluster_slurm_time=1", "-e", "vidcluster_slurm_signal_seconds=20")
    wait_for_epoch(cluster, job, 1, play)
    stop_requests = [job_dir(cluster, job) / node.name / STOP_REQUEST_FILE for node in compute(cluster)]
    deadline = time.monotonic() + 180
    with contextlib.ExitStack() as slowed:
        for node in compute(cluster):
            slowed.enter_context(cpu_quota(node, 0.1))
        while not any(request.exists() for request in stop_requests):
            assert play.poll() is None and time.monotonic() < deadline, f"{job} was not stopped at its time limit"
            time.sleep(0.2)
    while not account(cluster, job).get("next") and len(account(cluster, job)["allocations"]) < 2:
        assert play.poll() is None and time.monotonic() < deadline, f"{job} was not requeued at its time limit"
        time.sleep(0.5)
    as_admin(cluster, "scontrol", "update", f"JobId={account(cluster, job)['slurm_job']}", "TimeLimit=UNLIMITED")
    out = finish(play, timeout=600)
    assert f"Job {job} finished" in flat(out), out[-4000:]
    allocations = account(cluster, job)["allocations"]
    assert len(allocations) >= 2 and all(a["ended"]["action"] == "requeue" for a in allocations[:-1]), allocations
    assert "time limit is near" in allocations[0]["ended"]["why"]
    shown, runs = slurm_view(cluster, job)
    assert f" Restarts={len(allocations) - 1} " in shown and len(runs) == len(allocations)
    preempted = [a for a in attempts(job) if a["cause"] == "preempted"]
    # Checkpointed at the step it stopped at. On a loaded machine a run's start can outlast the signal's 40 s: that
    # run is stopped before its trainer reported a step, so it lost none, and its successor starts afresh (steps_lost
    # null: no step was reported, none could be trained again).
    assert any(a["resumed_from"] and a["steps_lost"] == 0 for a in preempted), (attempts(job), allocations)
    assert all(a["steps_lost"] == 0 or (a["steps_lost"] is None and not a["resumed_from"]) for a in preempted), (
        attempts(job), allocations)
    for node in allocations[0]["members"]:  # every rank checkpointed and stopped with the checkpoint's status
        assert "the trainer exited with status 75" in (job_dir(cluster, job) / node / "train.log").read_text()
    assert digest(job)


def test_training_status_shows_the_queue_and_the_progress_and_stop_training_stops_it(cluster: LocalCluster,
                                                                                   dataset: Path) -> None:
    job = f"{cluster.name}-stop"
    # The job waits in the queue until the test has looked at it, then the administrator lets it start: a begin time
    # a few seconds ahead could pass before the look, on a loaded machine.
    extra = {"vidcluster_slurm_sbatch_extra": ["--begin=now+3600"]}
    out = finish(launch(cluster, job, 1000, "-e", "wait=false", "-e", json.dumps(extra)))
    assert "submitted as Slurm job" in flat(out), out[-3000:]
    queued = flat(cluster.playbook("training-status.yml", "-e", f"job_id={job}").stdout)
    assert re.search(rf"{job}: Slurm job \d+: PENDING \(BeginTime\)", queued), queued[-3000:]
    assert re.search(rf"{job}: running; waiting \(attempt 1 of 4\): Slurm: job \d+ PENDING \(BeginTime\)", queued)
    slurm_job = re.search(r"submitted as Slurm job (\d+)", flat(out))[1]
    as_admin(cluster, "scontrol", "update", f"JobId={slurm_job}", "StartTime=now")
    wait_for_epoch(cluster, job, 2, None)
    running = flat(cluster.playbook("training-status.yml", "-e", f"job_id={job}").stdout)
    assert re.search(rf"{job}: Slurm job \d+: RUNNING on node\S+ for ", running), running[-3000:]
    assert re.search(rf"{job}: running; running: epoch \d+/1000 done", running), running[-3000:]
    stopped = flat(cluster.playbook("stop-training.yml", "-e", f"job_id={job}").stdout)
    assert f"{job}: stopped; the job stopped: stopped: stopped by user: stop-training.yml" in stopped, stopped[-3000:]
    assert "gone without an end" not in stopped  # every node says the job stopped
    status = run_status(cluster, job)
    assert status["state"] == "preempted", (status.get("message"), node_logs(cluster, job))
    step = status["step"]
    checkpoints = job_dir(cluster, job) / "run" / "checkpoints"
    assert any(p.name.endswith(f"_step_{step:08d}.pth") for p in checkpoints.iterdir())  # at the agreed step
    shown, _ = slurm_view(cluster, job)
    assert " JobState=COMPLETED " in shown or " JobState=CANCELLED " in shown, shown
    assert account(cluster, job)["outcome"]["state"] == "stopped"


def test_teardown_is_complete(cluster: LocalCluster) -> None:
    # Runs last in this module: the playbook alone (no force-delete) must leave nothing behind.
    daemons = running_daemons(cluster)
    assert len(daemons) >= 2, daemons  # slurmctld and munged at least
    run_playbook(CLUSTER_PLAYBOOK, "-e", f"cluster_name={cluster.name}", "-e", "state=absent")
    assert not [pid for pid, line in daemons.items() if running(pid) == line]
    assert not netns_names(cluster.name) and not link_names(cluster.name)
    assert not Path(f"/run/vidcluster/slurm-{cluster.name}").exists()
    assert not cluster.state_dir.exists()
