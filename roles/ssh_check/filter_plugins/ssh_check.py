"""Filters of the ssh_check role: which peers each node probes, and the report of all probes (linear in the pairs).

``FilterModule`` registers the plain functions below for Ansible.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

BROKEN_OK = ("ok", "slow")  # reasons of a pair that works
# Above this many nodes a matrix is no longer readable: a summary and the broken pairs only.
MATRIX_MAX_NODES = 32


def targets(layout: Mapping[str, Any], source: str, sample: int = 0) -> dict[str, Any]:
    """``{targets, first}`` for ``source``: every node (``first`` rotates the order to start after the source), or
    with ``sample`` > 0 its ring neighbours plus ``sample`` peers drawn at random (seeded by the source's name, so a
    rerun probes the same pairs)."""
    order = list(layout["members"])
    rows = [{"name": name, "host": layout["nodes"][name]["ip"], "port": layout["nodes"][name]["port"]}
            for name in order]
    index = order.index(source)
    if sample <= 0 or sample + 3 >= len(order):
        return {"targets": rows, "first": index + 1}
    ring = {order[(index - 1) % len(order)], order[(index + 1) % len(order)], source}
    others = [name for name in order if name not in ring]
    picked = ring | set(random.Random(source).sample(others, sample))
    chosen = [row for row in rows if row["name"] in picked]
    return {"targets": chosen, "first": next(i for i, r in enumerate(chosen) if r["name"] == order[(index + 1)
                                                                                               % len(order)])}


def _cell(reason: str, width: int) -> str:
    return reason.center(width)


def report(hosts: Sequence[str], probes: Mapping[str, Any], hints: Mapping[str, str]) -> dict[str, Any]:
    """Every probed pair, the broken and slow ones, and the lines to print: a node x node matrix up to
    MATRIX_MAX_NODES nodes, else a summary. ``probes``: source -> its registered module result."""
    pairs: dict[tuple[str, str], dict[str, Any]] = {}
    for src in hosts:
        result = probes.get(src) or {}
        rows = result.get("results")
        if rows is None:  # the probe did not run on this node
            for dst in hosts:
                pairs[(src, dst)] = {"reason": "not_run", "detail": str(result.get("msg", "")).strip()}
            continue
        for row in rows:
            pairs[(src, row["name"])] = {"reason": row["reason"], "detail": row.get("detail", ""),
                                         "seconds": row.get("seconds"), "attempts": row.get("attempts", 1)}
    broken = [{"src": s, "dst": d, **p, "hint": hints.get(p["reason"], "")}
              for (s, d), p in pairs.items() if p["reason"] not in BROKEN_OK]
    slow = [{"src": s, "dst": d, **p} for (s, d), p in pairs.items() if p["reason"] == "slow"]
    retried = sum(1 for p in pairs.values() if p.get("attempts", 1) > 1)
    summary = (f"{len(pairs)} pairs probed among {len(hosts)} nodes: {len(pairs) - len(broken)} work "
               f"({len(slow)} slow), {len(broken)} broken; {retried} needed a second try")
    if len(hosts) <= MATRIX_MAX_NODES:
        width = max([len(h) for h in hosts] + [16])
        lines = [" | ".join(_cell(c, width) for c in ["from \\ to", *hosts])]
        for src in hosts:
            cells = [pairs.get((src, dst), {}).get("reason", "-") for dst in hosts]
            lines.append(" | ".join(_cell(c, width) for c in [src, *cells]))
        lines.append(summary)
    else:
        lines = [summary]
        lines += [f"slow: {p['src']} -> {p['dst']} ({p['detail']})" for p in slow[:50]]
    lines += [f"BROKEN {p['src']} -> {p['dst']}: {p['reason']}" for p in broken[:200]]
    if len(broken) > 200:
        lines.append(f"... and {len(broken) - 200} more broken pairs")
    return {"pairs": len(pairs), "broken": broken, "slow": slow, "lines": lines, "summary": summary}


class FilterModule:
    """Registers the functions above as Ansible filters."""

    def filters(self) -> dict[str, Callable[..., Any]]:
        return {"ssh_check_targets": targets, "ssh_check_report": report}
