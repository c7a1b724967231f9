"""Filters of the prepare_data role, run on the controller.

``FilterModule`` registers the plain functions below for Ansible.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any


def prepare_data_place(text: str, hosts: Sequence[str]) -> dict[str, str]:
    """{node, path}: ``NODE:/path`` (or ``NODE:path``, from the node user's home) when NODE is a host of the play;
    anything else is a path with no node named (node "")."""
    node, sep, path = text.partition(":")
    if sep and node in hosts:
        return {"node": node, "path": path}
    return {"node": "", "path": text}


def prepare_data_on_node(path: str) -> str:
    """A path as a node reads it: absolute, or under the cluster user's home ("~/...")."""
    return path if path.startswith("/") else "~/" + path.removeprefix("~").lstrip("/")


def prepare_data_unfit(probes: Mapping[str, Mapping[str, Any]], in_place: Sequence[str], writers: Sequence[str],
                       holder: str, collector: str) -> list[str]:
    """What keeps nodes from taking part, one line per tool: every node lacking it, with why. Every node runs ffmpeg
    and ffprobe; rsync is needed by a node sent its sources (and the node holding them) and by a node that sends what
    it makes (and the node that writes the destination)."""
    fetching = [node for node in probes if node not in in_place]
    sending = [node for node in probes if node not in writers]
    needs_rsync = {*fetching, *sending, *([holder] if fetching and holder else []), *([collector] if sending else [])}
    lacking: dict[str, list[str]] = {}
    for node, probe in probes.items():
        for tool, problem in probe["tools"].items():
            if problem and (tool != "rsync" or node in needs_rsync):
                lacking.setdefault(tool, []).append(f"{node} ({problem})")
    return [f"{tool} does not run on {', '.join(nodes)}: install it there (Debian and Ubuntu: apt-get install "
            f"{'ffmpeg' if tool != 'rsync' else 'rsync'})" for tool, nodes in sorted(lacking.items())]


class FilterModule:
    def filters(self) -> dict[str, Callable[..., Any]]:
        return {"prepare_data_place": prepare_data_place, "prepare_data_on_node": prepare_data_on_node,
                "prepare_data_unfit": prepare_data_unfit}
