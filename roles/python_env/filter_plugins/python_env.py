"""Filters of the python_env role: CUDA -> driver requirements, video decoder checks and the cross-node version
comparison.

Plain functions, so tests import this file directly; ``FilterModule`` only registers them for Ansible.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

# Shown for a version the node could not report (no environment, package missing, no CUDA build).
NOT_AVAILABLE = "n/a"


def _version_key(version: str) -> tuple[int, ...]:
    """Numeric key of a dotted version ('570.86.10' -> (570, 86, 10)); NVIDIA versions have no letters."""
    return tuple(int(part) for part in re.findall(r"\d+", str(version)))


def cuda_min_driver(cuda: str, table: Mapping[str, str]) -> str:
    """Minimum Linux driver for a CUDA ``major.minor`` taken from ``table``.

    An unknown CUDA version is an error rather than a guess: a lower entry under-states the requirement and a
    higher one could reject a working driver.
    """
    wanted = ".".join(str(cuda).split(".")[:2])
    if wanted not in table:
        known = ", ".join(sorted(table, key=_version_key))
        raise ValueError(f"CUDA {wanted} is not in python_env_driver_table (known: {known}); add its minimum driver")
    return str(table[wanted])


def driver_supports(driver: str, required: str) -> bool:
    """True when the installed driver version is at least the required one."""
    return _version_key(driver) >= _version_key(required)


def parse_gpus(smi_lines: Sequence[str]) -> list[dict[str, str]]:
    """GPUs from ``nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader`` lines."""
    gpus = []
    for line in smi_lines:
        if line.strip():
            name, driver, memory = (field.strip() for field in line.rsplit(",", 2))
            gpus.append({"name": name, "driver": driver, "memory": memory})
    return gpus


def torch_cuda_from_requirements(requirements: str, default: str) -> str:
    """CUDA version of the pinned torch build: from a ``+cuXYZ`` local version in the pin, else ``default``.

    ``torch==2.5.1+cu121`` -> ``12.1``; ``torch==2.14.1`` (the default PyPI build, CUDA 13.0 for 2.14) -> default.
    """
    for line in requirements.splitlines():
        match = re.match(r"\s*torch\s*==\s*[\w.]+\+cu(\d+)(\d)\b", line.split("#", 1)[0])
        if match:
            return f"{int(match.group(1))}.{match.group(2)}"
    return str(default)


def _is_version(value: Any) -> bool:
    """A reported version ('0.6.0', '5.1.9-0+deb12u1'), not 'missing', 'broken: ...', 'not found' or 'n/a'."""
    return bool(re.match(r"\d", str(value)))


def decoder_problems(report: Mapping[str, Any], decoders: Sequence[str]) -> list[str]:
    """What keeps a node from running each video decoder in ``decoders`` ('decord', 'torchcodec'), read from its
    environment report (env_report.py); [] when it can run them all. torchcodec also needs FFmpeg's libraries."""
    problems = []
    for decoder in decoders:
        version = report.get(decoder, "missing")
        if not _is_version(version):
            problems.append(f"{decoder} is {version}")
        elif decoder == "torchcodec" and not _is_version(report.get("ffmpeg")):
            problems.append(f"torchcodec {version} cannot load FFmpeg's shared libraries ({report.get('ffmpeg')})")
    return problems


def _cell(value: Any) -> str:
    """One table cell: GPU lists become '2x NVIDIA H200', missing values 'n/a'."""
    if value is None or value == "":
        return NOT_AVAILABLE
    if isinstance(value, list):
        if not value:
            return "none"
        names = [str(gpu.get("name", gpu)) if isinstance(gpu, Mapping) else str(gpu) for gpu in value]
        return ", ".join(f"{names.count(name)}x {name}" for name in dict.fromkeys(names))
    return str(value)


def _render(rows: Sequence[Sequence[str]]) -> list[str]:
    """Left-aligned text table with a rule under the header; one string per line (readable in Ansible output)."""
    widths = [max(len(row[col]) for row in rows) for col in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return lines


def version_table(
    reports: Mapping[str, Mapping[str, Any]], compare: Sequence[str], show: Sequence[str] = ()
) -> dict[str, Any]:
    """Compare the nodes' environment reports.

    ``reports`` maps node name -> report (keys as printed by env_report.py, plus the GPU facts); ``compare`` are
    the keys that must be equal on every node; ``show`` are extra columns for the full table only (GPUs, driver).
    Returns ``ok``, ``differing`` (keys), ``table`` (every node x every column), ``diff_table`` (every node x the
    differing keys) and ``summary`` (one line per differing key naming each value's nodes).
    """
    nodes = list(reports)
    cells = {node: {key: _cell(reports[node].get(key)) for key in [*compare, *show]} for node in nodes}
    differing = [key for key in compare if len({cells[node][key] for node in nodes}) > 1]
    summary = []
    for key in differing:
        by_value: dict[str, list[str]] = {}
        for node in nodes:
            by_value.setdefault(cells[node][key], []).append(node)
        summary.append(f"{key}: " + "; ".join(f"{value} on {', '.join(on)}" for value, on in by_value.items()))

    def table(keys: Sequence[str]) -> list[str]:
        return _render([["node", *keys], *([node, *(cells[node][key] for key in keys)] for node in nodes)])

    return {
        "ok": not differing,
        "differing": differing,
        "table": table([*compare, *show]),
        "diff_table": table(differing) if differing else [],
        "summary": summary,
    }


def slurm_reports(written: Mapping[str, Mapping[str, str]]) -> dict[str, Any]:
    """The compute nodes' reports from a Slurm job's files (task -> {out: its report, which names its node; err: its
    stderr}): ``{reports: {node: report}, failed: {'task N': why}}``. A report's GPUs are the ones torch sees there
    (nvidia-smi is the login host's business only), its driver the one env_report.py read on the node."""
    reports: dict[str, Any] = {}
    failed: dict[str, str] = {}
    for task, files in written.items():
        try:
            report = json.loads(files["out"])
        except ValueError:
            words = " ".join(str(files.get("err", "")).split())
            failed[f"task {task}"] = words or "it wrote no report"
            continue
        reports[str(report.pop("node", f"task {task}"))] = {**report, "gpus": report.get("torch_gpus", [])}
    return {"reports": reports, "failed": failed}


def slurm_problems(reports: Mapping[str, Mapping[str, Any]], gpus: int, decoders: Sequence[str],
                   driver_table: Mapping[str, str]) -> list[str]:
    """What keeps each compute node from training as a job of the site would: torch sees another number of GPUs than
    the job was given, a driver too old for the installed torch's CUDA, a chosen decoder that cannot run."""
    problems = []
    for node, report in reports.items():
        seen = len(report.get("torch_gpus") or [])
        if seen != gpus:
            problems.append(f"{node}: torch sees {seen} GPU(s), the job was given {gpus} (vidcluster_slurm_gpus_per_"
                            "node; a torch build without CUDA, or a driver that does not load?)")
        cuda, driver = str(report.get("cuda", NOT_AVAILABLE)), str(report.get("driver", NOT_AVAILABLE))
        if gpus and NOT_AVAILABLE not in (cuda, driver):
            needed = cuda_min_driver(cuda, driver_table)
            if not driver_supports(driver, needed):
                problems.append(f"{node}: NVIDIA driver {driver} is too old for torch's CUDA {cuda} (needs {needed})")
        problems += [f"{node}: {problem}" for problem in decoder_problems(report, decoders)]
    return problems


class FilterModule:
    """Registers the filters as python_env_<name>."""

    def filters(self) -> dict[str, Callable[..., Any]]:
        return {
            "python_env_cuda_min_driver": cuda_min_driver,
            "python_env_decoder_problems": decoder_problems,
            "python_env_driver_supports": driver_supports,
            "python_env_parse_gpus": parse_gpus,
            "python_env_slurm_problems": slurm_problems,
            "python_env_slurm_reports": slurm_reports,
            "python_env_torch_cuda": torch_cuda_from_requirements,
            "python_env_version_table": version_table,
        }
