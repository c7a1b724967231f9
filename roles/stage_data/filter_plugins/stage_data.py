"""Filters of the stage_data role, run on the controller: the request laid out (where the data comes from, where it
goes, every handle and file of the copy: the collection vidcluster.launcher's module_utils/stage.py names them), the
copy plan (a tree of rsyncs whose senders double every round) and each transfer's route, and the messages (sizes,
free space, which nodes hold a complete copy). The role's YAML holds no path of its own: it asks these.

Plain functions, so tests import this file directly; ``FilterModule`` only registers them for Ansible. The words for
sizes and senders are the collection's plugin_utils/words.py, which the transfer action's lines use too.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ansible_collections.vidcluster.launcher.plugins.module_utils import manifest, stage
from ansible_collections.vidcluster.launcher.plugins.plugin_utils.words import CONTROLLER, files, human, sender_name


def stage_data_source(src: str, hosts: Sequence[str]) -> dict[str, str]:
    """{node, path}: ``NODE:/path`` (or ``NODE:path``, from the node user's home) when NODE is a host of the play;
    otherwise a folder on the controller (node "")."""
    node, sep, path = src.partition(":")
    if sep and node in hosts:
        return {"node": node, "path": path}
    return {"node": "", "path": src}


def stage_data_layout(src: str, dest: str, hosts: Sequence[str], cwd: str, cache: str, token: str = "") -> dict:
    """Every place of one request: ``{origin: {node, path}, dest, handles: {node: name}, src_handle, manifest_cache,
    run_dir}``.

    ``origin``: where the data comes from (node "" is the controller, its path made absolute from ``cwd``, where
    ansible-playbook runs). ``dest``: the destination as every node reads it (absolute, or "~/..." in the cluster
    user's home). ``handles``: each node's handle of its copy; ``src_handle``: the source node's handle of the
    source folder. ``manifest_cache``: the controller's manifest of the source; ``run_dir``: this play's records.
    """
    origin = stage_data_source(src, hosts)
    if not origin["node"] and origin["path"]:
        origin["path"] = os.path.realpath(os.path.join(cwd, os.path.expanduser(origin["path"])))
    given = dest if dest.startswith("/") else "~/" + dest.removeprefix("~").lstrip("/")
    controller = stage.Controller(cache, token)
    return {
        "origin": origin,
        "dest": given,
        "handles": {node: stage.Handle.of(stage.STAGE_DIR, "d", dest, node).name for node in hosts},
        "src_handle": stage.Handle.of(stage.STAGE_DIR, "s", src, origin["node"]).name,
        "manifest_cache": controller.manifest(origin["path"] if not origin["node"] else src),
        "run_dir": controller.run_dir,
        "cache": cache,
        "token": token,
    }


def stage_data_routes(plan: Mapping[str, Any], layout: Mapping[str, Any], states: Mapping[str, Mapping[str, Any]],
                      source: Mapping[str, Any] | None = None) -> list[dict[str, dict[str, Any]]]:
    """Each round of ``plan`` as ``{receiver: transfer}``, every transfer with the route its copy takes: ``kind``
    (push: the controller sends; pull: the receiver copies from a peer over the SSH mesh; local: the source node
    copies its own folder), rsync's ``source`` and ``dest``, the ``need`` list, the ``lock`` (a push: the ``handle``,
    the action naming its lock by where it connects) and ``progress`` file of the copy and the controller's ``record``
    of it. ``states``: each receiver's prepare result (its absolute stage folder and destination); ``source``: the
    source node's source result (its absolute source folder).
    """
    controller = stage.Controller(layout["cache"], layout["token"])
    rounds = []
    for batch in plan["rounds"]:
        routes = {}
        for t in batch:
            node, sender = t["receiver"], t["sender"]
            mine = stage.Handle(states[node]["stage"], layout["handles"][node])  # on the receiver
            remote = stage.Handle(stage.STAGE_DIR, layout["handles"][node])  # the same, from its home (rsync)
            if sender == CONTROLLER:
                route = {"kind": "push", "source": layout["origin"]["path"], "dest": remote.path,
                         "need": f":{remote.need}", "handle": remote.name, "progress": controller.progress(node)}
            else:
                if sender == node:  # the source node's own folder
                    kind, where = "local", str((source or {})["src"])
                elif t["origin"]:
                    kind, where = "pull", f"{sender}:{stage.STAGE_DIR}/{layout['src_handle']}"
                else:
                    kind, where = "pull", f"{sender}:{stage.STAGE_DIR}/{layout['handles'][sender]}"
                route = {"kind": kind, "source": where, "dest": str(states[node]["dest"]), "need": mine.need,
                         "lock": mine.lock, "progress": mine.progress(layout["token"])}
            routes[node] = {**t, **route, "record": controller.record(node)}
        rounds.append(routes)
    return rounds


def stage_data_results(hostvars: Mapping[str, Any], nodes: Sequence[str], register: str,
                       before: Mapping[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """Each node's stage_data_node result registered as ``register``: its output, or {error: its message}; a node
    that skipped the task keeps what ``before`` says of it."""
    results = {}
    for node in nodes:
        result = hostvars[node].get(register) or {}
        if result.get("skipped") and before is not None:
            results[node] = dict(before[node])
        elif "error" in result or "module_stderr" in result or result.get("unreachable"):  # (failed_when: false)
            results[node] = {"error": str(result.get("error") or result.get("msg") or "no message").strip()}
        else:
            results[node] = {k: v for k, v in result.items() if k not in ("changed", "failed", "invocation")}
    return results


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


def stage_data_plan_text(plan: Mapping[str, Any], dest: str, source: Mapping[str, Any]) -> str:
    """One line: what is copied, in how many rounds, who sends to whom (``source``: the source's manifest totals)."""
    size = f"{files(source['files'])}, {human(source['bytes'])}"
    rounds = plan["rounds"]
    steps = " | ".join(", ".join(f"{sender_name(t)} -> {t['receiver']}" for t in batch) for batch in rounds)
    return (f"Copying {files(plan['files'])}, {human(plan['bytes'])} in all, to make {dest} complete ({size}) on "
            f"{sum(len(batch) for batch in rounds)} node(s) in {len(rounds)} round(s): {steps}")


def stage_data_unfit(states: Mapping[str, Mapping[str, Any]], sources: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Why nodes cannot take part, each naming its node: a copy that could not be prepared, rsync that does not run
    on a node holding a copy or the source folder, too little free space for what a copy lacks. ``states``:
    stage_data_node prepare's result per node (or {error}); ``sources``: stage_data_node source's result of the source
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


def stage_data_copies(results: Mapping[str, Mapping[str, Any]], sharers: Mapping[str, Sequence[str]]) -> dict:
    """Which nodes hold a complete, unchanged copy: ``{complete: [nodes], problems: [lines], text}``.

    ``results``: each node that holds a copy, its check (``{check: report}``, stage_data_results) or ``{error}``;
    ``sharers``: for each of them, every node that reads that copy (itself included; more on a shared folder).
    Copies made from different manifests are all named.
    """
    reports = {node: r if "error" in r else r.get("check") or {"error": "not checked"} for node, r in results.items()}
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
            problems.append(f"{who}: {manifest.problems(report)}")
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
            "stage_data_layout": stage_data_layout,
            "stage_data_routes": stage_data_routes,
            "stage_data_results": stage_data_results,
            "stage_data_plan": stage_data_plan,
            "stage_data_plan_text": stage_data_plan_text,
            "stage_data_unfit": stage_data_unfit,
            "stage_data_copies": stage_data_copies,
            "stage_data_moved": stage_data_moved,
            "stage_data_size": human,
        }
