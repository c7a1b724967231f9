"""trainer.distributed with real processes: spawned gloo workers, torchrun, the legacy launcher, a rendezvous that
times out, and AUTO_RANK_MATCH inside a network namespace whose interface has several addresses."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import yaml

from tests.ports import free_port
from tests.trainer._dist_entry import precise_bn_batches
from trainer.config import Config, validate_config
from trainer.distributed import (
    DistContext,
    DistributedError,
    add_launcher_args,
    all_gather_object,
    all_reduce_sum,
    barrier,
    broadcast_object,
    launch,
)

REPO = Path(__file__).resolve().parents[2]
ENTRY = REPO / "tests" / "trainer" / "_dist_entry.py"


def ddp_cfg(out: Path, **ddp: Any) -> dict[str, Any]:
    """A gloo config for one node with two CPU workers, writing into ``out``; ``ddp`` overrides DDP_CONFIG keys."""
    section = {
        "AUTO_RANK_MATCH": False,
        "WORLD_SIZE": 1,
        "WORLD_RANK": 0,
        "DIST_URL": f"tcp://127.0.0.1:{free_port()}",
        "WOLRD_URLS": ["127.0.0.1"],
        "DIST_BACKEND": "gloo",
        "DISTRIBUTED": True,
        "CPU_WORKERS": 2,
        "TIMEOUT_SECONDS": 60,
    }
    section.update(ddp)
    # The config requires a clip's decode time limit below the collectives' timeout (short ones here).
    data = {"DECODE_TIME_LIMIT": section["TIMEOUT_SECONDS"] / 2}
    return {"DDP_CONFIG": section, "CONFIG": {"LOG": {"BASE_PATH": str(out), "EXP_NAME": ""}, "DATA": data}}


def write_cfg(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def child_env(**extra: str) -> dict[str, str]:
    # No GPUs, so the CPU_WORKERS rule applies on any test machine; one thread each on the shared cores.
    env = dict(os.environ, PYTHONPATH=str(REPO), CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    env.update(extra)
    return env


def start(args: list[str], **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, *args],
        cwd=REPO,
        env=child_env(**env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(procs: list[subprocess.Popen[str]], timeout: float = 180) -> list[tuple[int, str]]:
    results = []
    for proc in procs:
        try:
            _, err = proc.communicate(timeout=timeout)
        finally:
            if proc.poll() is None:
                proc.kill()
        results.append((proc.returncode, err))
    return results


def records(out: Path, world: int) -> list[dict[str, Any]]:
    found = sorted(out.glob("rank*.json"))
    assert [p.name for p in found] == [f"rank{r}.json" for r in range(world)]
    return [json.loads(p.read_text()) for p in found]


def assert_world(recs: list[dict[str, Any]], world: int, per_node: int) -> None:
    for rank, rec in enumerate(recs):
        assert rec["rank"] == rank and rec["world_size"] == world
        assert rec["local_world_size"] == per_node and rec["num_nodes"] == world // per_node
        assert rec["node_rank"] * per_node + rec["local_rank"] == rank
        assert rec["sum"] == world * (world + 1) / 2  # all_reduce of rank + 1 over every rank
        assert rec["gathered"] == list(range(world))
        assert rec["broadcast"] == "from rank 0"
        assert (rec["gpu_world_rank"], rec["gpu_world_size"], rec["gpu"]) == (rank, world, rec["local_rank"])
        assert rec["distributed"] and rec["group_initialized"] and rec["device"] == "cpu"
        env = rec["env"]  # the worker's environment, as torchrun exports it
        assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"]) == (str(rank), str(rec["local_rank"]), str(world))
        assert (env["LOCAL_WORLD_SIZE"], env["GROUP_RANK"]) == (str(per_node), str(rec["node_rank"]))
        assert env["MASTER_ADDR"] in ("127.0.0.1", "localhost") and env["MASTER_PORT"].isdigit()
    assert len({rec["pid"] for rec in recs}) == world
    assert_precise_bn_averaged_over_ranks([rec["precise_bn"] for rec in recs])


def assert_precise_bn_averaged_over_ranks(stats: list[dict[str, Any]]) -> None:
    """Every rank ends with the same statistics: the mean over every rank's batches of each batch's mean and
    unbiased variance (rank 1's empty second batch is skipped on all ranks alike)."""
    batches = [b["video"] for rank in range(len(stats)) for i, b in enumerate(precise_bn_batches(rank)) if i != 1]
    mean = torch.stack([b.mean(dim=(0, 2, 3, 4)) for b in batches]).mean(dim=0)
    var = torch.stack([b.transpose(0, 1).reshape(3, -1).var(dim=1) for b in batches]).mean(dim=0)
    for rank_stats in stats:
        assert rank_stats == stats[0]  # identical on every rank, to the bit
    assert stats[0]["used"] == len(batches)
    torch.testing.assert_close(torch.tensor(stats[0]["mean"]), mean.float())
    torch.testing.assert_close(torch.tensor(stats[0]["var"]), var.float())


def test_two_nodes_rank_is_node_rank_times_workers_plus_local(tmp_path: Path) -> None:
    # Two nodes on this host, each spawning two gloo workers. GPU_WORLD_SIZE/GPU_WORLD_RANK/GPU in the file are
    # wrong on purpose: launch computes them.
    wrong = {"GPU_WORLD_SIZE": 8, "GPU_WORLD_RANK": 5, "GPU": 3}
    data = ddp_cfg(tmp_path, WORLD_SIZE=2, WOLRD_URLS=["127.0.0.1", "127.0.0.2"], CPU_WORKERS=2, **wrong)
    cfg = str(write_cfg(tmp_path, data))
    node0 = start([str(ENTRY), "--config-file", cfg])
    node1 = start([str(ENTRY), "--config-file", cfg, "DDP_CONFIG.WORLD_RANK", "1"])
    for rc, err in finish([node0, node1]):
        assert rc == 0, err
    recs = records(tmp_path, 4)
    assert_world(recs, world=4, per_node=2)
    assert [rec["world_rank"] for rec in recs] == [0, 0, 1, 1]


def test_torchrun_environment_decides(tmp_path: Path) -> None:
    # The file says one node with two workers at another port: torchrun's environment wins.
    cfg = write_cfg(tmp_path, ddp_cfg(tmp_path, CPU_WORKERS=3))
    port = free_port()
    args = ["-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", "2", "--master_addr", "127.0.0.1"]
    ((rc, err),) = finish([start([*args, "--master_port", str(port), str(ENTRY), "--config-file", str(cfg)])])
    assert rc == 0, err
    recs = records(tmp_path, 2)
    assert_world(recs, world=2, per_node=2)
    # Nothing told gloo an interface: the trainer chose the one that routes to the rendezvous host, as the launcher
    # would (not what this host's name happens to resolve to).
    assert [rec["gloo_socket_ifname"] for rec in recs] == ["lo", "lo"]


def test_a_torchrun_restart_forms_a_new_group_though_the_agents_store_keeps_the_last_attempts_keys(
    tmp_path: Path,
) -> None:
    # Rank 0 dies in attempt 0 and comes 3 s late to attempt 1, so rank 1 reads the store before rank 0 writes to it
    # (in gloo's mesh the higher rank connects to the lower one's address): with the store torchrun's agent keeps
    # across restarts, it would read rank 0's address of attempt 0, connect to a port nobody listens on and fail (one
    # run in three hung there instead, when the timing made it so); with one restart allowed, the run would end 1.
    cfg = write_cfg(tmp_path, ddp_cfg(tmp_path, TIMEOUT_SECONDS=60))
    args = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "--max-restarts", "1"]
    ((rc, err),) = finish([start([*args, str(ENTRY), "--config-file", str(cfg)], VCT_DIE_RANK="0")], timeout=300)
    assert rc == 0, err[-3000:]
    recs = records(tmp_path, 2)
    assert [rec["attempt"] for rec in recs] == [1, 1]
    assert_world(recs, world=2, per_node=2)


AGENT_WORKER = textwrap.dedent(
    """
    import json, os, sys, time
    import torch, torch.distributed as dist
    from trainer.distributed.context import Plan
    from trainer.distributed.process_group import init_group
    rank, late = int(os.environ["RANK"]), float(sys.argv[1])
    time.sleep(late)
    plan = Plan(node_rank=rank, num_nodes=2, per_node=1, backend="gloo", init_method="env://", timeout_s=20,
                dist_url=f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}", use_cuda=False, source="torchrun")
    init_group(plan.context(0), plan)
    total = torch.tensor([rank + 1.0])
    dist.all_reduce(total)
    print(json.dumps({"rank": rank, "sum": total.item()}))
    dist.destroy_process_group()
    """
)


def test_the_workers_of_one_torchrun_round_form_it_whatever_each_agents_restart_count(tmp_path: Path) -> None:
    """Multi-node torchrun: each agent counts its own restarts (one whose worker failed counts one, one restarted for
    the new membership does not), so the workers of one round see different TORCHELASTIC_RESTART_COUNTs, in a store
    (the agents') that still holds the keys of the attempts before. A first attempt forms and ends; the second's
    ranks have counts 5 and 2, rank 0 coming 2 s late (rank 1 reads the store first): they form one group (named by
    the count, they waited in two namespaces, rank 1 on the first attempt's dead addresses, until the timeout)."""
    port = free_port()
    agents_store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)  # as rank 0's agent
    try:
        for counts, late in (((0, 0), (0, 0)), ((5, 2), (2, 0))):
            env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2",
                   "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RUN_ID": "job"}
            workers = [subprocess.Popen([sys.executable, "-c", AGENT_WORKER, str(late[rank])], cwd=REPO,
                                        env=child_env(**env, RANK=str(rank),
                                                      TORCHELASTIC_RESTART_COUNT=str(counts[rank])),
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                       for rank in (0, 1)]
            outs = [worker.communicate(timeout=90) for worker in workers]
            for worker, (_, err) in zip(workers, outs, strict=True):
                assert worker.returncode == 0, f"restart counts {counts}: {err[-2000:]}"
            assert [json.loads(out) for out, _ in outs] == [{"rank": 0, "sum": 3.0}, {"rank": 1, "sum": 3.0}]
    finally:
        del agents_store


def test_a_group_that_cannot_form_ends_the_process_within_the_timeout(tmp_path: Path) -> None:
    # A wait that raises nothing (gloo connecting to a peer that died while connecting): the watch ends the process
    # with status 1 (a restart may help) and one line, 5 s after TIMEOUT_SECONDS (the timeout's own error comes first
    # wherever torch honours it).
    stuck = textwrap.dedent(
        """
        import logging, time
        from trainer.distributed.context import Plan
        from trainer.distributed.process_group import _formed_within
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
        plan = Plan(node_rank=0, num_nodes=1, per_node=2, backend="gloo", dist_url="tcp://127.0.0.1:9",
                    init_method="env://", timeout_s=2, use_cuda=False, source="torchrun")
        with _formed_within(plan.context(1), plan):
            time.sleep(60)
        """
    )
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", stuck], cwd=REPO, env=child_env(), capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 1, proc.stderr
    assert time.monotonic() - started < 2 + 5 + 10
    assert "rank 1 of 2: the process group did not form within 2s at tcp://127.0.0.1:9" in proc.stderr
    assert "Traceback" not in proc.stderr


def srun_env(rank: int, world: int = 2, **extra: str) -> dict[str, str]:
    """What srun sets for task ``rank`` of a step of one task per node on ``world`` nodes named node0, node1..."""
    return {"SLURM_PROCID": str(rank), "SLURM_NTASKS": str(world), "SLURM_LOCALID": "0", "SLURM_NODEID": str(rank),
            "SLURM_STEP_ID": "0", "SLURM_JOB_ID": "4242", "SLURM_STEP_NUM_NODES": str(world),
            "SLURM_STEP_TASKS_PER_NODE": f"1(x{world})", "SLURM_STEP_NODELIST": f"node[0-{world - 1}]", **extra}


def test_srun_environment_decides(tmp_path: Path) -> None:
    # The file says one node with two workers: srun's tasks decide (one worker each, rank SLURM_PROCID). A real srun
    # on the local Slurm cluster runs the same entry in tests/cluster/test_slurm.py.
    cfg = str(write_cfg(tmp_path, ddp_cfg(tmp_path, CPU_WORKERS=2)))
    rendezvous = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    for rc, err in finish([start([str(ENTRY), "--config-file", cfg], **srun_env(rank, **rendezvous))
                           for rank in (0, 1)]):
        assert rc == 0, err
    recs = records(tmp_path, 2)
    assert_world(recs, world=2, per_node=1)
    assert [rec["node_rank"] for rec in recs] == [0, 1]


def test_srun_rank0_address_comes_from_scontrol_or_the_launch_fails_saying_why(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # No MASTER_ADDR: the rank-0 node's address must come from the step's node list; where scontrol cannot use the
    # Slurm configuration, or is not there at all, the task stops with one line instead of guessing an address.
    for name, value in srun_env(1).items():
        monkeypatch.setenv(name, value)
    (tmp_path / "slurm.conf").write_text("")  # a configuration that names no cluster: scontrol refuses at once
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "slurm.conf"))
    cfg = validate_config(ddp_cfg(tmp_path))
    with pytest.raises(DistributedError, match=r"scontrol show hostnames node\[0-1\] failed \(.+\): cannot find "
                       "the rank-0 node's address") as raised:
        launch(_unused, cfg)
    assert raised.value.exit_status == 2
    monkeypatch.setenv("PATH", str(tmp_path))  # no scontrol here
    with pytest.raises(DistributedError, match="scontrol is not on PATH"):
        launch(_unused, cfg)
    monkeypatch.setenv("SLURM_STEP_TASKS_PER_NODE", "2,1")
    with pytest.raises(DistributedError, match=r"srun started 2,1 tasks per node.+use --ntasks-per-node"):
        launch(_unused, cfg)
    assert not dist.is_initialized()


def test_legacy_torch_distributed_launch(tmp_path: Path) -> None:
    cfg = write_cfg(tmp_path, ddp_cfg(tmp_path))
    args = ["-m", "torch.distributed.launch", "--nproc_per_node", "2", "--master_port", str(free_port())]
    ((rc, err),) = finish([start([*args, str(ENTRY), "--config-file", str(cfg)])])
    assert rc == 0, err
    assert_world(records(tmp_path, 2), world=2, per_node=2)


def test_local_rank_argument_without_launcher_environment(tmp_path: Path) -> None:
    cfg = str(write_cfg(tmp_path, ddp_cfg(tmp_path, CPU_WORKERS=2)))
    procs = [start([str(ENTRY), "--local_rank", "1", "--config-file", cfg])]
    procs.append(start([str(ENTRY), "--local-rank=0", "--config-file", cfg]))
    for rc, err in finish(procs):
        assert rc == 0, err
    assert_world(records(tmp_path, 2), world=2, per_node=2)


def test_launcher_args_accept_both_spellings() -> None:
    parser = add_launcher_args(argparse.ArgumentParser())
    assert parser.parse_args(["--local_rank", "3"]).local_rank == 3
    assert parser.parse_args(["--local-rank=2"]).local_rank == 2
    assert parser.parse_args([]).local_rank is None


def test_failing_worker_fails_launch(tmp_path: Path) -> None:
    cfg = write_cfg(tmp_path, ddp_cfg(tmp_path, CPU_WORKERS=2))
    ((rc, err),) = finish([start([str(ENTRY), "--config-file", str(cfg)], VCT_FAIL_RANK="1")])
    assert rc == 1, err  # a crashed worker is not a bad input (2): a launcher may restart it
    assert err.splitlines()[-1] == "error: local worker 1 failed: ValueError: worker with rank 1 fails on purpose", err


def _unused(ctx: DistContext, cfg: Config) -> None:
    raise AssertionError("the worker must not run when the rendezvous fails")


@pytest.mark.parametrize("node_rank", [0, 1], ids=["rank0-waits-for-peer", "rank1-finds-no-rank0"])
def test_rendezvous_timeout_names_the_address(tmp_path: Path, node_rank: int) -> None:
    # A world of two nodes where only this one starts (one worker per node, no spawn). In a process of its own: a
    # group that has not formed 5 s after its timeout ends its process (above), and a loaded test machine must not
    # end the test's.
    port = free_port()
    data = ddp_cfg(
        tmp_path,
        WORLD_SIZE=2,
        WORLD_RANK=node_rank,
        WOLRD_URLS=["127.0.0.1", "127.0.0.2"],
        DIST_URL=f"tcp://127.0.0.1:{port}",
        CPU_WORKERS=1,
        TIMEOUT_SECONDS=2,
    )
    ((rc, err),) = finish([start([str(ENTRY), "--config-file", str(write_cfg(tmp_path, data))])], timeout=60)
    assert rc == 1, err  # peers that did not come are not a bad input: a restart may help
    assert re.fullmatch(rf"error: rank {node_rank} of 2: .*rendezvous tcp://127\.0\.0\.1:{port} within 2s.*",
                        err.splitlines()[-1]), err
    assert "Traceback" not in err and "did not form" not in err  # the timeout's own error, not the watch's


def test_not_distributed_runs_in_this_process_without_collectives(tmp_path: Path) -> None:
    # Inconsistent DDP settings do not matter when DISTRIBUTED is False; the run name is fixed once.
    data = ddp_cfg(tmp_path, DISTRIBUTED=False, WORLD_SIZE=2, DIST_BACKEND="nccl")
    data["CONFIG"]["LOG"]["EXP_NAME"] = "use_time"
    seen: list[tuple[DistContext, Config]] = []

    def worker(ctx: DistContext, cfg: Config) -> None:
        tensor = torch.tensor([5.0])
        assert all_reduce_sum(tensor) is tensor and tensor.item() == 5.0
        assert all_gather_object("x") == ["x"] and broadcast_object("y") == "y"
        barrier(ctx)
        seen.append((ctx, cfg))

    started = time.time()
    launch(worker, validate_config(data))
    ended = time.time()
    ((ctx, cfg),) = seen
    assert (ctx.rank, ctx.world_size, ctx.local_rank, ctx.distributed, ctx.is_main) == (0, 1, 0, False, True)
    assert not dist.is_initialized()
    named = time.mktime(time.strptime(cfg.CONFIG.LOG.EXP_NAME, "%Y-%m-%d-%H-%M-%S"))  # the local time of the launch
    assert int(started) <= named <= ended


# ---------------------------------------------------------------------------------------------------------------------
# Local addresses and AUTO_RANK_MATCH on a host (network namespace) with several addresses on one interface

PROBE = textwrap.dedent(
    """
    import json
    from trainer.config import DDPConfig
    from trainer.distributed import DistributedError, resolve_node_rank
    from trainer.runtime.host.network import _proc_addresses, interface_addresses, local_addresses, route_interface

    def rank(urls, world_rank=0):
        ddp = DDPConfig(AUTO_RANK_MATCH=True, WORLD_SIZE=len(urls), WOLRD_URLS=urls, DIST_URL=f"tcp://{urls[0]}:29500",
                        WORLD_RANK=world_rank)
        try:
            return resolve_node_rank(ddp)
        except DistributedError as exc:
            return str(exc)

    print(json.dumps({
        "v4": rank(["10.231.9.9", "10.231.1.7", "10.231.2.2"]),
        "v6": rank(["10.231.9.9", "fd00:231::7"]),
        "none": rank(["10.231.9.9", "10.231.9.10"]),
        "both": rank(["10.231.0.5", "10.231.1.7"]),
        "claimed_right": rank(["10.231.9.9", "10.231.1.7", "10.231.2.2"], world_rank=1),
        "claimed_wrong": rank(["10.231.9.9", "10.231.1.7", "10.231.2.2"], world_rank=2),
        "routes": [route_interface(url) for url in ("tcp://10.231.1.9:29500", "tcp://[fd00:231::9]:29500",
                                                    "tcp://127.0.0.1:29500", "tcp://no-such-host.invalid:29500")],
        "addresses": local_addresses(),
        "interfaces": interface_addresses(),
        "proc": _proc_addresses(),
    }))
    """
)


@pytest.fixture(scope="module")
def netns() -> Iterator[str]:
    name = f"vct-{os.getpid()}"
    commands = [
        ["ip", "netns", "add", name],
        # veth, not dummy: the dummy module may be missing; both ends stay inside the namespace. No IPv6 link-local
        # addresses (their MAC-derived values are random): the namespace holds exactly the addresses given here.
        ["ip", "-n", name, "link", "add", "vct0", "type", "veth", "peer", "name", "vct1"],
        ["ip", "-n", name, "link", "set", "vct0", "addrgenmode", "none"],
        ["ip", "-n", name, "link", "set", "vct1", "addrgenmode", "none"],
        ["ip", "-n", name, "addr", "add", "10.231.0.5/24", "dev", "vct0"],
        ["ip", "-n", name, "addr", "add", "10.231.1.7/24", "dev", "vct0"],
        ["ip", "-n", name, "addr", "add", "fd00:231::7/64", "dev", "vct0", "nodad"],
        ["ip", "-n", name, "link", "set", "vct0", "up"],
        ["ip", "-n", name, "link", "set", "vct1", "up"],
        ["ip", "-n", name, "link", "set", "lo", "up"],
    ]
    try:
        for command in commands:
            subprocess.run(command, check=True, capture_output=True, text=True)
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


@pytest.fixture(scope="module")
def probe(netns: str) -> dict[str, Any]:
    command = ["ip", "netns", "exec", netns, sys.executable, "-c", PROBE]
    done = subprocess.run(command, cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=120, check=True)
    return json.loads(done.stdout)


def test_local_addresses_list_every_address_of_every_interface(probe: dict[str, Any]) -> None:
    assert probe["interfaces"] == [["lo", "127.0.0.1"], ["lo", "::1"], ["vct0", "10.231.0.5"], ["vct0", "10.231.1.7"],
                                   ["vct0", "fd00:231::7"]]
    assert probe["addresses"] == ["127.0.0.1", "::1", "10.231.0.5", "10.231.1.7", "fd00:231::7"]
    # Without iproute2's JSON: the kernel's tables, which name the interface of IPv6 addresses only
    assert sorted(map(tuple, probe["proc"])) == [("?", "10.231.0.5"), ("?", "10.231.1.7"), ("?", "127.0.0.1"),
                                                 ("lo", "::1"), ("vct0", "fd00:231::7")]


def test_auto_rank_match_finds_a_secondary_address(probe: dict[str, Any]) -> None:
    assert probe["v4"] == 1  # WOLRD_URLS[1] is the interface's second IPv4 address
    assert probe["v6"] == 1


def test_auto_rank_match_errors_list_the_addresses(probe: dict[str, Any]) -> None:
    message = probe["none"]
    assert "none of DDP_CONFIG.WOLRD_URLS" in message
    for addr in ("10.231.9.9", "10.231.9.10", "10.231.0.5 (vct0)", "10.231.1.7 (vct0)", "127.0.0.1 (lo)"):
        assert addr in message
    assert "ambiguous" in probe["both"] and "[0, 1]" in probe["both"]


def test_auto_rank_match_checks_a_world_rank_the_file_claims(probe: dict[str, Any]) -> None:
    # 0 (GluonCV's tutorial file on every node) leaves the rank to the match; any other rank must agree with it.
    assert probe["v4"] == 1 and probe["claimed_right"] == 1
    assert probe["claimed_wrong"].startswith("DDP_CONFIG.WORLD_RANK is 2 but AUTO_RANK_MATCH finds this host at rank 1")


def test_the_interface_is_the_one_that_routes_to_the_rendezvous_host(probe: dict[str, Any]) -> None:
    # 10.231.1.9 and fd00:231::9 are on vct0's subnets, 127.0.0.1 is this host's loopback; a name that does not
    # resolve leaves the choice to gloo (and the log says so).
    assert probe["routes"] == ["vct0", "vct0", "lo", None]
