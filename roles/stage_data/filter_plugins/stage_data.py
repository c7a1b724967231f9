"""Filters of the stage_data role, run on the controller: where the data comes from, the copy plan (a tree of rsyncs
whose senders double every round), and the messages (sizes, free space, which nodes hold a complete copy).

Plain functions, so tests import this file directly; ``FilterModule`` only registers them for Ansible. The transfer
action (action_plugins/stage_data_transfer.py) formats its progress lines with ``human`` and ``rate_eta`` too.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

CONTROLLER = "controller"


def _manifest_module() -> Any:
    """trainer/data/manifest.py, the owner of what a copy lacks (loaded by path: the trainer is not installed here)."""
    path = Path(__file__).resolve().parents[3] / "trainer" / "data" / "manifest.py"
    spec = importlib.util.spec_from_file_location("stage_data_manifest", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look themselves up there
    spec.loader.exec_module(module)
    return module


MANIFEST = _manifest_module()


def human(n: float) -> str:
    """A size in decimal units, three significant digits: 0 B, 512 B, 2.05 MB, 1.07 GB."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            value = n / scale
            return f"{value:.3g} {unit}" if value < 100 else f"{value:.0f} {unit}"
    return f"{int(n)} B"


def files(n: int) -> str:
    """'1 file', '500 files'."""
    return f"{n} file" if int(n) == 1 else f"{n} files"


def rate_eta(done: float, total: float, seconds: float) -> str:
    """'48.2 MB/s, ETA 12 s' from bytes done of a total after some seconds."""
    if seconds <= 0 or done <= 0:
        return "starting"
    rate = done / seconds
    left = max(total - done, 0) / rate
    eta = f"{left:.0f} s" if left < 120 else f"{left / 60:.0f} min"
    return f"{human(rate)}/s, ETA {eta}"


def stage_data_source(src: str, hosts: Sequence[str]) -> dict[str, str]:
    """{node, path}: ``NODE:/path`` (or ``NODE:path``, from the node user's home) when NODE is a host of the play;
    otherwise a folder on the controller (node "")."""
    node, sep, path = src.partition(":")
    if sep and node in hosts:
        return {"node": node, "path": path}
    return {"node": "", "path": src}


def _transfer(sender: str, receiver: str, report: Mapping[str, Any], origin: bool) -> dict[str, Any]:
    return {"sender": sender, "receiver": receiver, "origin": origin, "files": int(report["need_files"]),
            "bytes": int(report["need_bytes"])}


def stage_data_plan(reports: Mapping[str, Mapping[str, Any]], writers: Sequence[str], origin: str = "") -> dict:
    """The copy as rounds of transfers: ``{rounds: [[{sender, receiver, origin, files, bytes}]], files, bytes}``.

    ``reports``: what each node that writes a copy (one per shared folder) lacks (need_files, need_bytes), in play
    order ``writers``; ``origin``: the node holding the source folder, "" for the controller. Nodes with a complete
    copy send; when none has one, the origin sends to one seed (itself when it takes part, else the node lacking the
    least), once. Every round each complete node then sends to one node still lacking files, largest needs first: the
    senders double, so N copies take 1 + ceil(log2 N) rounds and the origin sends each byte once.
    """
    pending = [node for node in writers if int(reports[node]["need_files"]) > 0]
    holders = [node for node in writers if int(reports[node]["need_files"]) == 0]
    rounds: list[list[dict[str, Any]]] = []
    if pending and not holders:
        seed = origin if origin in pending else min(pending, key=lambda n: int(reports[n]["need_bytes"]))
        rounds.append([_transfer(origin or CONTROLLER, seed, reports[seed], origin=True)])
        pending.remove(seed)
        holders.append(seed)
    pending.sort(key=lambda n: -int(reports[n]["need_bytes"]))  # stable: play order among equals
    while pending:
        batch = [_transfer(sender, receiver, reports[receiver], origin=False)
                 for sender, receiver in zip(holders, pending, strict=False)]
        del pending[: len(batch)]
        rounds.append(batch)
        holders += [transfer["receiver"] for transfer in batch]
    moves = [transfer for batch in rounds for transfer in batch]
    return {"rounds": rounds, "files": sum(t["files"] for t in moves), "bytes": sum(t["bytes"] for t in moves)}


def sender_name(transfer: Mapping[str, Any]) -> str:
    """'controller', 'node1' (its complete copy) or 'node1:source' (the source folder on node1)."""
    origin_node = transfer["origin"] and transfer["sender"] != CONTROLLER
    return f"{transfer['sender']}:source" if origin_node else str(transfer["sender"])


def stage_data_plan_text(plan: Mapping[str, Any], dest: str, manifest: Mapping[str, Any]) -> str:
    """One line: what is copied, in how many rounds, who sends to whom."""
    size = f"{files(manifest['files'])}, {human(manifest['bytes'])}"
    rounds = plan["rounds"]
    steps = " | ".join(", ".join(f"{sender_name(t)} -> {t['receiver']}" for t in batch) for batch in rounds)
    return (f"Copying {files(plan['files'])}, {human(plan['bytes'])} in all, to make {dest} complete ({size}) on "
            f"{sum(len(batch) for batch in rounds)} node(s) in {len(rounds)} round(s): {steps}")


def stage_data_unfit(states: Mapping[str, Mapping[str, Any]], sources: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Why nodes cannot take part, each naming its node: a copy that could not be prepared, rsync that does not run
    on a node holding a copy or the source folder, too little free space for what a copy lacks. ``states``:
    stage_node.py prepare's output per node (or {error}); ``sources``: stage_node.py source's output of the source
    node, if any."""
    problems = [f"{node}: {state['error']}" for node, state in states.items() if "error" in state]
    no_rsync = {node: str(out["rsync"]) for node, out in [*states.items(), *sources.items()] if out.get("rsync")}
    if no_rsync:
        listed = ", ".join(f"{node} ({why})" for node, why in no_rsync.items())
        problems.append(f"rsync does not run on {listed}: install it there (Debian and Ubuntu: apt-get install "
                        "rsync); stage-data copies with rsync, node to node over the SSH of the cluster")
    short = [f"{node} needs {human(r['required_bytes'])} free in {r['dir']} and has {human(r['free_bytes'])}"
             for node, r in ((n, s.get("check") or {}) for n, s in states.items())
             if r and int(r["required_bytes"]) > int(r["free_bytes"])]
    if short:
        problems.append("too little free space: " + ", ".join(short))
    return problems


def stage_data_copies(reports: Mapping[str, Mapping[str, Any]], sharers: Mapping[str, Sequence[str]]) -> dict:
    """Which nodes hold a complete, unchanged copy: ``{complete: [nodes], problems: [lines], text}``.

    ``reports``: verify reports of the nodes that hold a copy; ``sharers``: for each of them, every node that reads
    that copy (itself included; more on a shared folder). Copies made from different manifests are all named.
    """
    copies = {node: r for node, r in reports.items() if "error" not in r}
    digests = {str(r["digest"]) for r in copies.values()}
    complete, problems = [], []
    for node, report in reports.items():
        readers = list(sharers.get(node) or [node])
        who = node if len(readers) == 1 else f"{node} (for {', '.join(readers)})"
        if "error" in report:
            problems.append(f"{who}: {report['error']}")
        elif report["complete"]:
            complete += readers
        else:
            problems.append(f"{who}: {MANIFEST.problems(report)}")
    first = next(iter(copies.values()), None)
    size = f"{files(first['files'])}, {human(first['bytes'])}" if first else "no copy"
    text = (f"Complete, unchanged copies ({size}, from {first['source'] if first else '?'}): "
            f"{', '.join(complete) or 'none'}.")
    if problems:
        text += " Incomplete or changed: " + "; ".join(problems) + "."
    if len(digests) > 1:
        text += f" The copies follow {len(digests)} different manifests (different versions of the data)."
    extras = [f"{node} ({r['extra']}: {', '.join(r['examples']['extra'])})" for node, r in copies.items()
              if r["extra"]]
    if extras:
        text += (" Files not in the manifest (kept; -e delete=true removes them when staging): "
                 + "; ".join(extras) + ".")
    return {"complete": complete, "problems": problems, "consistent": len(digests) <= 1, "text": text}


def stage_data_moved(records: Sequence[Mapping[str, Any]], dataset_bytes: int) -> str:
    """What this run moved, from the transfers' records: the controller's share against the data's size."""
    sent = sum(int(r.get("sent", 0)) for r in records if r["sender"] == CONTROLLER)
    by_nodes = sum(int(r.get("received", 0)) for r in records if r["sender"] != CONTROLLER)
    moved = sum(int(r.get("bytes", 0)) for r in records)
    ratio = f" ({sent / dataset_bytes:.2f}x the data)" if dataset_bytes else ""
    return (f"This run copied {human(moved)} to {len(records)} node(s): the controller sent {human(sent)} (as rsync "
            f"counts){ratio}, the nodes passed {human(by_nodes)} on to each other.")


class FilterModule:
    """Registers the functions above as Ansible filters."""

    def filters(self) -> dict[str, Callable[..., Any]]:
        return {
            "stage_data_source": stage_data_source,
            "stage_data_plan": stage_data_plan,
            "stage_data_plan_text": stage_data_plan_text,
            "stage_data_unfit": stage_data_unfit,
            "stage_data_copies": stage_data_copies,
            "stage_data_moved": stage_data_moved,
            "stage_data_size": human,
        }
