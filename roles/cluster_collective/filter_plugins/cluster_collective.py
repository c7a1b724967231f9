"""Filter of the cluster_collective role: every node's run of files/collective_check.py put together, with the node or
pair that could not join named and why.

A plain function, so tests import this file directly; ``FilterModule`` only registers it for Ansible.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

OK = "ok"
# What each failure usually means, in the report's words.
FIREWALL_INTO = ("a firewall on {node} closing the ports gloo and NCCL listen on (the ephemeral range), or a wrong "
                 "cluster interface")
ROOT_CLOSED = "a firewall on {root} closing port {port}, or a wrong cluster_ip for {root}"
SOCKETS = "NET/Socket"


def _result(name: str, run: Mapping[str, Any]) -> dict[str, Any]:
    """A node's JSON report, or a failure saying why there is none (the check could not start, or ran over)."""
    try:
        found = json.loads(str(run.get("stdout", "")).strip().splitlines()[-1])
        if isinstance(found, dict) and found.get("node") == name:
            return found
    except (ValueError, IndexError):
        pass
    why = str(run.get("stderr") or run.get("msg") or "no output").strip().splitlines()
    return {"node": name, "failed": "run", "error": f"the check did not run to its end: {why[-1] if why else ''}",
            "pairs": {}, "missing": [], "bandwidth": None}


def _rendezvous(results: Sequence[dict[str, Any]], root: str) -> list[str]:
    """The nodes that could not reach the root's rendezvous: all of them point at the root."""
    lost = [r for r in results if r["failed"] == "rendezvous" and r["node"] != root and "cannot reach" in r["error"]]
    others = [r for r in results if r["node"] != root]
    if len(lost) > 1 and len(lost) == len(others):
        endpoint, why = lost[0]["error"].split("rendezvous ", 1)[1].rsplit(": ", 1)
        port = endpoint.rsplit(":", 1)[1]
        return [f"no node can reach {root}'s rendezvous {endpoint} ({why}): "
                + ROOT_CLOSED.format(root=root, port=port)]
    return [f"{r['node']} {r['error']}" for r in lost]


def _pairs(results: Sequence[dict[str, Any]]) -> list[str]:
    """The pairs that could not connect; a node no peer could connect to is named once, as the likely cause."""
    matrix = {r["node"]: r["pairs"] for r in results if r["pairs"]}
    failed = {(src, dst): why for src, row in matrix.items() for dst, why in row.items() if why != OK}
    lines = []
    for node in dict.fromkeys(dst for _, dst in failed):
        tried = [src for src, row in matrix.items() if node in row]
        into = [src for src in tried if (src, node) in failed]
        if len(tried) > 1 and into == tried:
            reasons = sorted({failed[(src, node)] for src in into})
            lines.append(f"{node} accepts no connection from {', '.join(into)} ({', '.join(reasons)}): "
                         + FIREWALL_INTO.format(node=node))
            for src in into:
                del failed[(src, node)]
    return lines + [f"{src} -> {dst}: {why}" for (src, dst), why in failed.items()]


def node_of_rank(results: Sequence[Mapping[str, Any]]) -> dict[int, str]:
    """{global rank: node} from every node's ``ranks`` (its first and its count)."""
    return {first: r["node"] for r in results if r.get("ranks")
            for first in range(r["ranks"]["first"], r["ranks"]["first"] + r["ranks"]["count"])}


def crossings(result: Mapping[str, Any], node_of: Mapping[int, str]) -> list[str]:
    """The node's links to other nodes as NCCL's log gives them, one per transport and pair of nodes: 'node1 -> node2
    via NET/Socket ("Channel 00/0 : 3[1] -> 4[0] [send] via NET/Socket/0")'."""
    found: dict[tuple[str, str, str], str] = {}
    for kind, links in ((result.get("nccl") or {}).get("transports") or {}).items():
        for link in links:
            src, dst = (node_of.get(link[end], f"rank {link[end]}") for end in ("from", "to"))
            if src != dst and result["node"] in (src, dst):
                found.setdefault((src, dst, kind), link["line"])
    return [f'{src} -> {dst} via {kind} ("{line}")' for (src, dst, kind), line in sorted(found.items())]


def below_floor(result: Mapping[str, Any], floor: float, node_of: Mapping[int, str]) -> str | None:
    """The line naming a node whose bus bandwidth is under ``floor`` GB/s (0: no floor) with what may explain it: the
    transports NCCL chose (a socket where the fabric was meant), the job's NCCL variables; None when it is above."""
    bandwidth = result.get("bandwidth")
    if not floor or not bandwidth or bandwidth["busbw_gbps"] >= floor:
        return None
    head = f"{result['node']}: {bandwidth['busbw_gbps']:g} GB/s bus bandwidth, floor {floor:g} GB/s"
    if result.get("backend") != "nccl":
        return f"{head}: gloo over {result.get('iface') or '?'} (TCP sockets; nccl only where every node has a GPU)"
    nccl = result.get("nccl") or {}
    kinds = set(nccl.get("transports") or {})
    question = ("is NCCL falling back to sockets?" if SOCKETS in kinds or nccl.get("network") == "Socket"
                else f"NCCL uses {', '.join(sorted(kinds)) or 'no transport it logged'}: a slow link or GPU?")
    env = ", ".join(f"{key}={value}" for key, value in (result.get("env") or {}).items()) or "no NCCL_* variable"
    links = crossings(result, node_of) or [f'{kind} ("{seen[0]["line"]}")'
                                            for kind, seen in (nccl.get("transports") or {}).items() if seen]
    return (f"{head}: {question} The job's NCCL environment: {env}; NCCL's network: {nccl.get('network') or '?'}"
            + (f"; {'; '.join(links)}" if links else ""))


def report(names: Sequence[str], runs: Mapping[str, Mapping[str, Any]], megabytes: int,
           min_busbw: float = 0.0) -> dict[str, Any]:
    """``names``: the nodes in rank order (the first holds the rendezvous); ``runs``: each node's async_status result
    (stdout: collective_check.py's JSON); ``min_busbw``: the floor in GB/s (0: none). Returns ``ok``, ``lines`` (a
    line per node: its interface, address, ranks and bandwidth, or what failed), ``problems`` (one line per node or
    pair to fix, or below the floor) and ``bandwidth`` ({node: bus bandwidth in GB/s, or None})."""
    results = [_result(name, runs.get(name, {})) for name in names]
    root = names[0]
    problems = [f"{r['node']}: {r['error']}" for r in results if r["failed"] in ("run", "interface", "check")]
    problems += _rendezvous(results, root)
    # The root that cannot listen, a node that reached the root but could not join its store.
    problems += [f"{r['node']}: {r['error']}" for r in results
                 if r["failed"] == "rendezvous" and r["error"].startswith(("cannot listen", "cannot join"))]
    reported = {r["node"] for r in results if r["failed"] is not None}
    missing = sorted({m for r in results for m in r["missing"]} - reported)
    problems += [f"{node} never reached the rendezvous" for node in missing]
    problems += _pairs(results)
    problems += [f"{r['node']}: {r['error']}" for r in results if r["failed"] == "collective"]
    node_of = node_of_rank(results)
    problems += [line for r in results if (line := below_floor(r, min_busbw, node_of)) is not None]
    lines = []
    for r in results:
        where = f"{r['node']} ({r.get('iface') or '?'} {r.get('addr', '?')})"
        bw = r["bandwidth"]
        if bw:
            ranks = r.get("ranks") or {"count": 1, "world": len(names)}
            nccl = r.get("nccl")
            carried = (f", NCCL network {nccl.get('network') or '?'} ({', '.join(sorted(nccl['transports'])) or '?'})"
                       if nccl else "")
            lines.append(f"{where}: {r['backend']} all-reduce of {megabytes} MiB over {len(names)} nodes "
                         f"({ranks['count']} of {ranks['world']} ranks here{carried}) in {1000 * bw['seconds']:.1f} "
                         f"ms: bus bandwidth {bw['busbw_gbps']:.3f} GB/s (algorithm {bw['algbw_gbps']:.3f} GB/s)")
        else:
            lines.append(f"{where}: no all-reduce (its {r['failed']} step failed)")
    bandwidth = {r["node"]: r["bandwidth"]["busbw_gbps"] if r["bandwidth"] else None for r in results}
    return {"ok": not problems, "lines": lines, "problems": problems, "bandwidth": bandwidth}


class FilterModule:
    """Registers the filter as cluster_collective_report."""

    def filters(self) -> dict[str, Callable[..., Any]]:
        return {"cluster_collective_report": report}
