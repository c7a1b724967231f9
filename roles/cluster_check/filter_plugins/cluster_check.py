"""Filters of the cluster_check role: every node's figures (files/node_check.py, and the all-reduce bandwidth of
roles/cluster_collective) in one table against the median of the nodes, the nodes below a threshold named; and the
held-out list (roles/cluster_inventory reads it for the launch) updated by ``act`` and ``release``.

Plain functions, so tests import this file directly; ``FilterModule`` only registers them for Ansible.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any

# The table's columns: (figure, heading); files/node_check.py measures the first three, the collective the last.
FIGURES = (("matmul", "matmul TFLOP/s"), ("decode", "decode clips/s"), ("read", "read MB/s"),
           ("allreduce", "all-reduce GB/s"))


def node_figures(name: str, run: Mapping[str, Any], busbw_gbps: float | None) -> dict[str, dict[str, Any]]:
    """A node's figures from its run of node_check.py (the command's result) and its all-reduce bus bandwidth."""
    try:
        found = json.loads(str(run.get("stdout", "")).strip().splitlines()[-1])
    except (ValueError, IndexError):
        why = str(run.get("stderr") or run.get("msg") or "no output").strip().splitlines()
        found = {key: {"error": f"the check did not run: {why[-1] if why else ''}"} for key, _ in FIGURES[:3]}
    figures = {key: found.get(key) or {"error": "not reported"} for key, _ in FIGURES[:3]}
    figures["allreduce"] = ({"value": busbw_gbps, "unit": "GB/s"} if busbw_gbps
                            else {"error": "no all-reduce (the collective check says why)"})
    return figures


def _cell(figure: Mapping[str, Any], median: float | None) -> str:
    if "error" in figure:
        return "-"
    ratio = f" ({figure['value'] / median:.2f})" if median else ""
    return f"{figure['value']:.3g}{ratio}"


def table(names: Sequence[str], runs: Mapping[str, Mapping[str, Any]], bandwidth: Mapping[str, float | None],
          threshold: float, held_out: Sequence[str] = ()) -> dict[str, Any]:
    """``names``: the measured nodes; ``runs``: each node's node_check.py result; ``bandwidth``: each node's all-reduce
    bus bandwidth in GB/s (None where it has none); ``threshold``: the fraction of the median a node must reach on
    every figure. Returns ``lines`` (the table: each figure, its ratio to the median in brackets, then the median,
    then one line per node below the threshold or without a figure), ``below`` ({node: why}) and ``missing``
    ({node: why}: figures that could not be measured)."""
    figures = {name: node_figures(name, runs.get(name, {}), bandwidth.get(name)) for name in names}
    medians: dict[str, float | None] = {}
    for key, _ in FIGURES:
        values = [f[key]["value"] for f in figures.values() if "error" not in f[key]]
        medians[key] = statistics.median(values) if values else None
    width = max(len(n) for n in [*names, "median"]) + 2
    lines = ["node".ljust(width) + "".join(heading.rjust(17) for _, heading in FIGURES)]
    below: dict[str, str] = {}
    missing: dict[str, str] = {}
    for name in names:
        held = "  (held out)" if name in held_out else ""
        lines.append(name.ljust(width) + "".join(_cell(figures[name][key], medians[key]).rjust(17)
                                                 for key, _ in FIGURES) + held)
        slow = [f"{key} {figures[name][key]['value'] / medians[key]:.2f}" for key, _ in FIGURES
                if "error" not in figures[name][key] and medians[key]
                and figures[name][key]["value"] < threshold * medians[key]]
        if slow:
            below[name] = f"below {threshold:g} of the median: {', '.join(slow)} of it"
        errors = [f"{key}: {figures[name][key]['error']}" for key, _ in FIGURES if "error" in figures[name][key]]
        if errors:
            missing[name] = "; ".join(errors)
    lines.append("median".ljust(width) + "".join((f"{medians[key]:.3g}" if medians[key] else "-").rjust(17)
                                                 for key, _ in FIGURES))
    seconds = {key: max((f[key].get("seconds", 0.0) for f in figures.values()), default=0.0) for key, _ in FIGURES[:3]}
    details = dict.fromkeys(f[key]["detail"] for f in figures.values() for key, _ in FIGURES[:2] if "detail" in f[key])
    lines.append("measured per node (the longest): " + ", ".join(f"{key} {s:.1f} s" for key, s in seconds.items())
                 + f"; {'; '.join(details)}")
    lines += [f"{name}: {why}" for name, why in below.items()]
    lines += [f"{name}: not measured - {why}" for name, why in missing.items()]
    return {"lines": lines, "below": below, "missing": missing}


def hold(held: Mapping[str, str], below: Mapping[str, str], when: str) -> dict[str, str]:
    """The held-out list with the nodes below the threshold added; a node held already keeps its first reason (a rerun
    that finds the same nodes changes nothing)."""
    return {**held, **{name: f"{why} (check-cluster.yml, {when})" for name, why in below.items() if name not in held}}


def release(held: Mapping[str, str], request: str) -> dict[str, Any]:
    """``request``: "all" or node names separated by commas. Returns ``held`` (what stays held out), ``released``
    and ``error`` (one line naming each node that is not held out, or "")."""
    names = list(held) if request.strip() == "all" else [n.strip() for n in request.split(",") if n.strip()]
    unknown = [name for name in names if name not in held]
    if not names or unknown:
        return {"held": dict(held), "released": [], "error": (
            f"-e release={request}: {', '.join(unknown) or 'no node named'} "
            f"{'is' if len(unknown) == 1 else 'are'} not held out (held out: {', '.join(held) or 'none'}); "
            "name held-out nodes separated by commas, or all")}
    return {"held": {name: why for name, why in held.items() if name not in names}, "released": names, "error": ""}


class FilterModule:
    """Registers the filters as cluster_check_table, cluster_check_hold and cluster_check_release."""

    def filters(self) -> dict[str, Callable[..., Any]]:
        return {"cluster_check_table": table, "cluster_check_hold": hold, "cluster_check_release": release}
