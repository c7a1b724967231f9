"""playbooks/stage-data.yml and playbooks/check-data.yml (roles/stage_data), and what they are made of.

  - the plan (pure): a tree whose senders double every round, 1 + ceil(log2 N) rounds, the source sending once;
  - the layout and each transfer's route (pure): every path the role's YAML used to compute, from one owner;
  - the collection's stage.py copy on this machine: real rsync, the progress file, a second copy stopping the first;
  - on the 3-node private-home cluster the SSH mesh tests use (private_cluster): the first copy (a source folder
    named with shell syntax, file names with spaces and non-ASCII letters: copied, nothing run), a rerun that moves
    nothing, a truncated file found by check-data and repaired from a peer, deletion only when asked, a source on a
    node, too little space on one node and no rsync on another (refused naming them before anything is copied), and
    a play interrupted halfway whose rerun sends only what was left, and two clusters that both have a node0 staged
    the same destination at once (neither stops the other's copy). A destination all nodes share (copied once):
    tests/cluster/test_launch.py's shared-home cluster.
Run: .venv/bin/python -m pytest -n 0 tests/cluster/test_stage_data.py  (root; a few minutes on 2 cores).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from ansible_collections.vidcluster.launcher.plugins.module_utils import stage as stage_layout
from ansible_collections.vidcluster.launcher.plugins.plugin_utils.words import human

from tests.cluster.conftest import (
    REPO,
    VENV_BIN,
    LocalCluster,
    Node,
    changed_total,
    flat,
    netns_pids,
    playbook_env,
)

ROLE = REPO / "roles" / "stage_data"
COPY_SCRIPT = Path(stage_layout.__file__)
MARKER = Path(f"/tmp/vcstage-{os.getpid()}")  # what `$(touch ...)` in a name would create, were it run
UNITS = {"B": 1, "kB": 1e3, "MB": 1e6, "GB": 1e9}


def filters() -> ModuleType:
    spec = importlib.util.spec_from_file_location("stage_data_filters", ROLE / "filter_plugins" / "stage_data.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


F = filters()


def need(n: int, size: int = 100) -> dict[str, Any]:
    return {"need_files": n, "need_bytes": n * size}


# ---- the plan ----
@pytest.mark.parametrize("nodes", [1, 2, 3, 4, 5, 8, 9, 16, 17, 32, 33])
def test_plan_is_a_tree_whose_senders_double(nodes: int) -> None:
    names = [f"node{i}" for i in range(nodes)]
    plan = F.stage_data_plan({name: need(3) for name in names}, names)
    rounds = plan["rounds"]
    assert len(rounds) == 1 + math.ceil(math.log2(nodes))
    assert rounds[0] == [{"sender": "controller", "receiver": "node0", "origin": True, "files": 3, "bytes": 300}]
    complete = {"node0"}
    for batch in rounds[1:]:
        senders = [t["sender"] for t in batch]
        assert len(set(senders)) == len(senders) and set(senders) <= complete  # one send each, from a full copy
        complete |= {t["receiver"] for t in batch}
    receivers = [t["receiver"] for batch in rounds for t in batch]
    assert sorted(receivers) == sorted(names) and (plan["files"], plan["bytes"]) == (3 * nodes, 300 * nodes)


def test_plan_uses_complete_copies_before_the_source_and_seeds_where_least_is_missing() -> None:
    names = ["node0", "node1", "node2", "node3"]
    partial = {"node0": need(10), "node1": need(2), "node2": need(10), "node3": need(10)}
    assert [[(t["sender"], t["receiver"]) for t in b] for b in F.stage_data_plan(partial, names)["rounds"]] == [
        [("controller", "node1")], [("node1", "node0")], [("node1", "node2"), ("node0", "node3")]]
    repaired = {"node0": need(0), "node1": need(0), "node2": need(1), "node3": need(0)}
    assert F.stage_data_plan(repaired, names)["rounds"] == [
        [{"sender": "node0", "receiver": "node2", "origin": False, "files": 1, "bytes": 100}]]
    from_node = F.stage_data_plan({name: need(4) for name in names}, names, origin="node2")["rounds"]
    assert from_node[0] == [{"sender": "node2", "receiver": "node2", "origin": True, "files": 4, "bytes": 400}]
    assert "node2:source -> node2 | node2 -> node0" in F.stage_data_plan_text(
        {"rounds": from_node, "files": 16, "bytes": 1600}, "data/x", {"files": 4, "bytes": 400})
    assert F.stage_data_plan({name: need(0) for name in names}, names)["rounds"] == []


def test_nodes_that_cannot_take_part_sources_and_sizes_are_said_plainly() -> None:
    states = {"node0": {"rsync": "", "check": {"required_bytes": 10, "free_bytes": 10, "dir": "/d"}},
              "node1": {"rsync": "", "check": {"required_bytes": 2_500_000_000, "free_bytes": 900_000_000,
                                                "dir": "/home/u/data/k400"}},
              "node2": {"error": "/data/k400: Permission denied"},
              "node3": {"rsync": "No such file or directory", "check": None}}
    assert F.stage_data_unfit(states, {"node4": {"rsync": "Permission denied"}}) == [
        "node2: /data/k400: Permission denied",
        "rsync does not run on node3 (No such file or directory), node4 (Permission denied): install it there "
        "(Debian and Ubuntu: apt-get install rsync); stage-data copies with rsync, node to node over the SSH of the "
        "cluster",
        "too little free space: node1 needs 2.5 GB free in /home/u/data/k400 and has 900 MB"]
    hosts = ["node0", "node1"]
    assert F.stage_data_source("node1:/scratch/k400", hosts) == {"node": "node1", "path": "/scratch/k400"}
    assert F.stage_data_source("data:v2", hosts) == {"node": "", "path": "data:v2"}  # not a node: the controller's
    assert [human(n) for n in (0, 999, 2_048_000, 150e6, 1.07e9)] == ["0 B", "999 B", "2.05 MB", "150 MB", "1.07 GB"]


def test_the_layout_and_each_route_name_every_place_once() -> None:
    """Where the data comes from and goes, every handle, and what each kind of transfer reads and writes: the paths
    the role's YAML used to build (a three-level conditional for rsync's source), now from one owner."""
    hosts = ["node0", "node1", "node2"]
    layout = F.stage_data_layout("videos", "data/k400", hosts, "/work/here", "/cache", "tok")
    d = {node: f"d{stage_layout.key('data/k400')}.{node}" for node in hosts}
    assert layout["origin"] == {"node": "", "path": "/work/here/videos"} and layout["dest"] == "~/data/k400"
    assert layout["handles"] == d and layout["run_dir"] == "/cache/runs/tok"
    assert layout["manifest_cache"] == f"/cache/{stage_layout.key('/work/here/videos')}.json"
    assert F.stage_data_layout("x", "~/data/k", hosts, "/w", "/c")["dest"] == "~/data/k"
    assert F.stage_data_layout("x", "/scratch/k", hosts, "/w", "/c")["dest"] == "/scratch/k"
    states = {node: {"stage": f"/home/{node}/vidcluster/stage", "dest": f"/home/{node}/data/k400"} for node in hosts}
    plan = F.stage_data_plan({node: need(2) for node in hosts}, hosts)
    first, second, _ = F.stage_data_routes(plan, layout, states)
    assert first["node0"] == {
        "sender": "controller", "receiver": "node0", "origin": True, "files": 2, "bytes": 200, "kind": "push",
        "source": "/work/here/videos", "dest": f"vidcluster/stage/{d['node0']}",
        "need": f":vidcluster/stage/{d['node0']}.need", "handle": d["node0"],
        "progress": "/cache/runs/tok/node0.progress", "record": "/cache/runs/tok/node0.json"}  # fmt: skip
    # The controller's lock of a push names where it connects too: two clusters may both have a node0.
    controller = stage_layout.Controller("/cache", "tok")
    handle = stage_layout.Handle(stage_layout.STAGE_DIR, d["node0"])
    assert controller.lock(handle, "u@10.0.0.1:22") != controller.lock(handle, "u@10.0.0.2:22")
    assert controller.lock(handle, "u@10.0.0.1:22").startswith(f"/cache/{d['node0']}.")
    assert second["node1"]["sender"] == "node0" and second["node1"]["record"] == "/cache/runs/tok/node1.json"
    assert {k: second["node1"][k] for k in ("kind", "source", "dest", "need", "lock", "progress")} == {
        "kind": "pull", "source": f"node0:vidcluster/stage/{d['node0']}", "dest": "/home/node1/data/k400",
        "need": f"/home/node1/vidcluster/stage/{d['node1']}.need",
        "lock": f"/home/node1/vidcluster/stage/{d['node1']}.lock",
        "progress": f"/home/node1/vidcluster/stage/{d['node1']}.tok.progress"}  # fmt: skip
    # A source on node1: it copies its own folder first, then the others pull from its copy.
    from_node = F.stage_data_layout("node1:/scratch/k", "data/k400", hosts, "/w", "/cache", "tok")
    assert from_node["origin"] == {"node": "node1", "path": "/scratch/k"}
    assert from_node["manifest_cache"] == f"/cache/{stage_layout.key('node1:/scratch/k')}.json"
    routes = F.stage_data_routes(F.stage_data_plan({n: need(1) for n in hosts}, hosts, origin="node1"), from_node,
                                 states, {"src": "/scratch/k"})
    assert (routes[0]["node1"]["kind"], routes[0]["node1"]["source"]) == ("local", "/scratch/k")
    assert routes[1]["node0"]["source"] == f"node1:vidcluster/stage/{d['node1']}"


# ---- one copy, on this machine ----
def copy_argv(need_file: Path, src: Path, dest: Path, *extra: str) -> list[str]:
    return ["rsync", "-t", "-I", "--from0", f"--files-from={need_file}", "--partial-dir=.vidcluster-partial",
            "--out-format=%i %l", "--stats", *extra, f"{src}/", f"{dest}/"]


def test_a_copy_keeps_a_progress_file_and_a_second_copy_of_the_same_place_stops_the_first(tmp_path: Path) -> None:
    src, dest = tmp_path / "src", tmp_path / "dest"
    names = [f"clip {i} ü.mp4" for i in range(4)]
    for name in names:
        (src / "train").mkdir(parents=True, exist_ok=True)
        (src / "train" / name).write_bytes(os.urandom(200_000))
    need_file = tmp_path / "need"
    need_file.write_bytes(b"".join(f"train/{name}".encode() + b"\0" for name in names))
    lock, slow, fast = tmp_path / "lock", tmp_path / "slow.progress", tmp_path / "fast.progress"
    first = subprocess.Popen([sys.executable, str(COPY_SCRIPT), "copy", str(lock), str(slow),
                              *copy_argv(need_file, src, dest, "--bwlimit=50")])
    try:
        deadline = time.monotonic() + 30
        while not (slow.exists() and json.loads(slow.read_text())["beat"] >= 2):
            assert time.monotonic() < deadline, "the first copy wrote no progress"
            time.sleep(0.1)
        second = subprocess.run([sys.executable, str(COPY_SCRIPT), "copy", str(lock), str(fast),
                                 *copy_argv(need_file, src, dest)], capture_output=True, text=True, timeout=60)
        assert first.wait(timeout=30) == 128 + signal.SIGTERM
    finally:
        first.kill()
    assert second.returncode == 0, second.stderr
    stopped, done = json.loads(slow.read_text()), json.loads(fast.read_text())
    assert stopped["done"] and stopped["error"] == "stopped by signal 15" and stopped["files"] < 4
    assert (done["done"], done["rc"], done["files"], done["bytes"]) == (True, 0, 4, 800_000)
    assert done["received"] > 0 and done["sent"] > 0
    assert all((dest / "train" / n).read_bytes() == (src / "train" / n).read_bytes() for n in names)


# ---- on the cluster ----
def make_files(root: Path, files: dict[str, bytes], owner: Node | None = None) -> None:
    """Write files under root; in a node's home (owner), its cluster user owns them and every folder made."""
    root.mkdir(parents=True, exist_ok=True)
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    if owner is not None:
        stat = owner.home.stat()
        for path in [*root.relative_to(owner.home).parents, *root.rglob("*"), root.relative_to(owner.home)]:
            os.chown(owner.home / path, stat.st_uid, stat.st_gid)


def data_files(root: Path) -> dict[str, bytes]:
    """The data in a folder: every file but the tools' own (.vidcluster*)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not any(part.startswith(".vidcluster") for part in p.relative_to(root).parts)}


def stage(cluster: LocalCluster, src: str, dest: str, *, check: bool = True,
          **extra: Any) -> subprocess.CompletedProcess[str]:
    settings = {"src": src, "dest": dest, "stage_data_poll_seconds": 0.5, **extra}
    return cluster.playbook("playbooks/stage-data.yml", "-e", json.dumps(settings), check=check)


def check_data(cluster: LocalCluster, dest: str) -> subprocess.CompletedProcess[str]:
    return cluster.playbook("playbooks/check-data.yml", "-e", json.dumps({"dest": dest}), check=False)


def sent_by_controller(stdout: str) -> float:
    """Bytes the controller's rsync sent, from the run's summary line."""
    found = re.search(r"the controller sent ([\d.]+) (B|kB|MB|GB) \(as rsync counts\)", flat(stdout))
    assert found, stdout[-3000:]
    return float(found[1]) * UNITS[found[2]]


def in_node(node: Node, *command: str, check: bool = True) -> None:
    """Run a command in every mount namespace of the node: its sshd's, which its sessions share, and that of any
    session still open from an sshd an earlier test restarted (Ansible's persistent connections outlive it)."""
    namespaces: dict[str, int] = {}
    for pid in netns_pids(node.netns):
        with contextlib.suppress(FileNotFoundError):  # it ended meanwhile
            namespaces[os.readlink(f"/proc/{pid}/ns/mnt")] = pid
    for pid in namespaces.values():
        subprocess.run(["nsenter", "-t", str(pid), "-m", *command], check=check, capture_output=True)


@pytest.fixture(scope="module")
def cluster(private_cluster: tuple[LocalCluster, str]) -> LocalCluster:
    return private_cluster[0]


@pytest.fixture(scope="module")
def staged(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A small dataset in a folder whose path holds `$(touch ...)`, staged once to a destination named likewise."""
    src = tmp_path_factory.mktemp("stage") / f"$(touch {MARKER})"
    files = {"train/a b.mp4": os.urandom(300_000), "train/ü ñ.mp4": os.urandom(250_000),
             "val/$(touch x).mp4": os.urandom(200_000), "top.txt": b"labels\n"}
    make_files(src, files)
    dest = f"data/stage ü $(touch {MARKER}-dest)"
    yield {"src": src, "dest": dest, "files": files, "first": stage(cluster, str(src), dest)}
    for node in cluster.nodes:
        shutil.rmtree(node.home / "data" / "stage ü $(touch ", ignore_errors=True)


def test_the_first_copy_is_a_tree_that_sends_each_byte_through_the_controller_once(
        cluster: LocalCluster, staged: dict[str, Any]) -> None:
    out = flat(staged["first"].stdout)
    assert "3 round(s): controller -> node0 | node0 -> node1 | node0 -> node2" in out
    assert "[round 1/3] node0 <- controller: starting, 4 files" in out
    assert re.search(r"\[round 3/3\] node2 <- node0: done, 4 files, 750 kB in \d+ s .* \| all: 12/12 files", out)
    size = sum(len(data) for data in staged["files"].values())
    assert size <= sent_by_controller(out) <= 1.2 * size
    for node in cluster.nodes:
        copy = node.home / staged["dest"]
        assert data_files(copy) == staged["files"], node.name
        assert (copy / ".vidcluster-manifest.json").is_file()
    # The names went to rsync and Python as arguments; no shell ever read them.
    assert not MARKER.exists() and not Path(f"{MARKER}-dest").exists()
    assert f"Complete, unchanged copies (4 files, 750 kB, from controller:{staged['src']}): node0, node1, node2." \
        in out


def test_a_rerun_of_unchanged_data_moves_and_changes_nothing(cluster: LocalCluster, staged: dict[str, Any]) -> None:
    rerun = stage(cluster, str(staged["src"]), staged["dest"])
    assert changed_total(rerun.stdout, ["localhost", *cluster.names]) == 0, rerun.stdout[-3000:]
    assert "[round" not in rerun.stdout
    assert "Complete, unchanged copies (4 files, 750 kB" in flat(rerun.stdout)


def test_a_damaged_copy_is_repaired_from_a_peer_and_files_gone_at_the_source_go_only_when_asked(
        cluster: LocalCluster, staged: dict[str, Any]) -> None:
    damaged = cluster.nodes[2].home / staged["dest"] / "train" / "a b.mp4"
    with open(damaged, "r+b") as f:
        f.truncate(1000)
    checked = check_data(cluster, staged["dest"])
    assert checked.returncode != 0
    assert "node0, node1. Incomplete or changed: node2: 1 changed (train/a b.mp4)" in flat(checked.stdout)

    (staged["src"] / "top.txt").unlink()
    repaired = stage(cluster, str(staged["src"]), staged["dest"])
    out = flat(repaired.stdout)
    assert "1 round(s): node0 -> node2" in out and sent_by_controller(out) == 0
    assert damaged.read_bytes() == staged["files"]["train/a b.mp4"]
    assert "Complete, unchanged copies (3 files, 750 kB" in out
    assert "Files not in the manifest (kept; -e delete=true removes them when staging): node0 (1: top.txt)" in out
    assert all((node.home / staged["dest"] / "top.txt").exists() for node in cluster.nodes)

    deleted = stage(cluster, str(staged["src"]), staged["dest"], delete=True)
    assert "Files not in the manifest" not in flat(deleted.stdout) and "[round" not in deleted.stdout
    assert not any((node.home / staged["dest"] / "top.txt").exists() for node in cluster.nodes)
    assert all(data_files(node.home / staged["dest"]) == data_files(staged["src"]) for node in cluster.nodes)


def test_a_source_folder_on_a_node_is_passed_on_by_the_nodes(cluster: LocalCluster) -> None:
    node1 = cluster.nodes[1]
    files = {"clips/x y.mp4": os.urandom(150_000), "clips/é.mp4": os.urandom(100_000)}
    make_files(node1.home / "stage source ü", files, owner=node1)
    try:
        out = stage(cluster, "node1:stage source ü", "data/from-node1")
        assert "3 round(s): node1:source -> node1 | node1 -> node0 | node1 -> node2" in flat(out.stdout)
        assert sent_by_controller(out.stdout) == 0
        assert all(data_files(node.home / "data" / "from-node1") == files for node in cluster.nodes)
        assert "from node1:/home/vctrain/stage source ü): node0, node1, node2." in flat(out.stdout)
    finally:
        shutil.rmtree(node1.home / "stage source ü")
        for node in cluster.nodes:
            shutil.rmtree(node.home / "data" / "from-node1", ignore_errors=True)


def test_nodes_that_cannot_take_part_are_named_before_anything_is_copied(cluster: LocalCluster,
                                                                         staged: dict[str, Any]) -> None:
    """Too little space on node1 (a small tmpfs over its destination) and no rsync on node2 (hidden in its mount
    namespace): one failure names both, and no data reached any node."""
    _, node1, node2 = cluster.nodes
    dest = "data/no-room"
    for node in cluster.nodes:
        make_files(node.home / dest, {}, owner=node)
    uid = node1.home.stat().st_uid
    in_node(node1, "mount", "-t", "tmpfs", "-o", f"size=256k,uid={uid},gid={uid}", "tmpfs", f"/home/vctrain/{dest}")
    try:
        in_node(node2, "mount", "--bind", "/dev/null", "/usr/bin/rsync")
        try:
            refused = stage(cluster, str(staged["src"]), dest, check=False)
        finally:
            in_node(node2, "umount", "/usr/bin/rsync", check=False)  # (a session may have come or gone meanwhile)
    finally:
        in_node(node1, "umount", f"/home/vctrain/{dest}", check=False)
    assert refused.returncode != 0
    out = flat(refused.stdout)
    assert "Cannot stage data/no-room: rsync does not run on node2 (Permission denied): install it there" in out
    assert re.search(r"; too little free space: node1 needs [\d.]+ (kB|MB) free in /home/vctrain/data/no-room and "
                     r"has \d+ kB\.", out), refused.stdout[-3000:]
    assert "node0 needs" not in out and "node0 (" not in out and "[round" not in out
    assert all(data_files(node.home / dest) == {} for node in cluster.nodes)
    for node in cluster.nodes:
        shutil.rmtree(node.home / dest)


def test_a_play_interrupted_halfway_continues_where_it_stopped(cluster: LocalCluster,
                                                               tmp_path: Path) -> None:
    files = {f"clip{i:02}.mp4": os.urandom(400_000) for i in range(12)}
    make_files(tmp_path / "src", files)
    dest, landed = "data/interrupted", cluster.nodes[0].home / "data" / "interrupted"
    settings = {"src": str(tmp_path / "src"), "dest": dest, "stage_data_bwlimit_kbps": 800}
    play = subprocess.Popen(
        [str(VENV_BIN / "ansible-playbook"), "-i", str(cluster.inventory), "playbooks/stage-data.yml",
         "-e", json.dumps(settings)], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env=playbook_env(),
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while len(data_files(landed) if landed.is_dir() else {}) < 4:  # a third of the first copy
            assert play.poll() is None and time.monotonic() < deadline, "the play ended before it could be stopped"
            time.sleep(0.2)
        play.send_signal(signal.SIGINT)  # Ctrl-C
        play.wait(timeout=60)
    finally:
        play.kill()
    time.sleep(1)  # anything the play left would still be writing
    held = data_files(landed)
    left = sum(len(data) for name, data in files.items() if held.get(name) != data)
    assert 0 < left < sum(len(data) for data in files.values())
    rerun = stage(cluster, str(tmp_path / "src"), dest)
    assert "controller -> node0" in flat(rerun.stdout)
    assert sent_by_controller(rerun.stdout) <= 1.1 * left
    assert all(data_files(node.home / dest) == files for node in cluster.nodes)
    for node in cluster.nodes:
        shutil.rmtree(node.home / dest)


def test_two_clusters_with_a_node0_each_stage_the_same_destination_at_once(cluster: LocalCluster,
                                                                          tmp_path: Path) -> None:
    """Two inventories whose one trainer is called node0, at two addresses (this cluster's node0 and node1), staging
    one controller folder to one destination at the same time: the controller's copy into each is a copy of its own
    (it used to share one lock by the node's name, and the second play stopped the first one's rsync)."""
    files = {f"clip{i:02}.mp4": os.urandom(400_000) for i in range(10)}
    make_files(tmp_path / "src", files)
    dest = "data/two-clusters"
    inventories, plays = [], []
    for node in cluster.nodes[:2]:
        text = cluster.inventory.read_text()
        group = yaml.safe_load(text)
        trainers = group["all"]["children"]["cluster"]["children"]["trainers"]["hosts"]
        group["all"]["children"]["cluster"]["children"]["trainers"]["hosts"] = {"node0": {**trainers[node.name],
                                                                                          "node_rank": 0}}
        inventories.append(tmp_path / f"inventory-{node.name}.yml")
        inventories[-1].write_text(yaml.safe_dump(group))
    # Started together, each copy slowed to about 12 s: the two copies overlap whichever play reaches its copy first.
    settings = {"src": str(tmp_path / "src"), "dest": dest, "stage_data_bwlimit_kbps": 300,
                "stage_data_poll_seconds": 0.5}
    try:
        for inventory in inventories:
            plays.append(subprocess.Popen(
                [str(VENV_BIN / "ansible-playbook"), "-i", str(inventory), "playbooks/stage-data.yml",
                 "-e", json.dumps(settings)], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                env=playbook_env(),
            ))  # fmt: skip
        outs = [play.communicate(timeout=300)[0] for play in plays]
    finally:
        for play in plays:
            play.kill()
    for play, out in zip(plays, outs, strict=True):
        assert play.returncode == 0, out[-3000:]
        assert "[round 1/1] node0 <- controller: done, 10 files" in flat(out), out[-3000:]
    try:
        assert all(data_files(node.home / dest) == files for node in cluster.nodes[:2])
    finally:
        for node in cluster.nodes:
            shutil.rmtree(node.home / dest, ignore_errors=True)
