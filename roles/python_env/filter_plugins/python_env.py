"""Filters of the python_env role: the torch build's requirements, the driver it needs, whether its kernels run on
each GPU, video decoder checks and the cross-node version comparison.

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


def driver_supports(driver: str, required: str) -> bool:
    """True when the installed driver version is at least the required one."""
    return _version_key(driver) >= _version_key(required)


def driver_verdict(driver: str, cuda: str, table: Mapping[str, str]) -> dict[str, Any]:
    """Whether NVIDIA driver ``driver`` runs a torch build for CUDA ``cuda`` ('12.6', '13.0.2'): ``{ok, needs,
    message}``, never an exception (a template error would be all a user saw).

    CUDA's minor-version compatibility: every build of a CUDA major version runs on that major's first driver
    (12.x on 525.60.13 or newer, 13.x on 580.65.06 or newer), so ``table`` is keyed by the major version; a
    "major.minor" key, where a site adds one, is more specific and wins. A CUDA version the table does not know
    is refused with a request to add it: a guess could under-state the requirement.
    """
    parts = str(cuda).split(".")
    key = next((k for k in (".".join(parts[:2]), parts[0]) if k in table), None)
    if key is None:
        known = ", ".join(sorted(table, key=_version_key))
        return {"ok": False, "needs": "", "message": (
            f"CUDA {cuda} is not in python_env_driver_table (known: {known}); add the minimum driver NVIDIA's CUDA "
            "release notes give for it")}
    needs = str(table[key])
    if driver_supports(driver, needs):
        return {"ok": True, "needs": needs, "message": f"driver {driver} runs CUDA {cuda} builds (needs {needs})"}
    return {"ok": False, "needs": needs, "message": (
        f"NVIDIA driver {driver} is too old for CUDA {cuda} builds, which need driver {needs} or newer (every CUDA "
        f"{parts[0]}.x build runs on it)")}


def builds_for_driver(driver: str, builds: Mapping[str, Mapping[str, Any]], table: Mapping[str, str]) -> list[str]:
    """The CUDA builds of ``builds`` NVIDIA driver ``driver`` runs (what a refusal advises: only builds that exist)."""
    return [name for name, spec in builds.items()
            if spec.get("cuda") and driver_verdict(driver, str(spec["cuda"]), table)["ok"]]


_PIN = re.compile(r"^\s*(torch|torchvision)\s*==\s*([0-9][^\s#;+]*)(\+[^\s#;]+)?(.*)$")
_TORCHCODEC_PIN = re.compile(r"^\s*torchcodec\s*==\s*[^\s#;]+(.*)$")


def torch_requirements(requirements: str, build: str, builds: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The requirements a node installs for torch build ``build`` (python_env_torch_builds: cu126, cu130, cu132,
    cpu): ``{ok, message, text, cuda, index}``.

    A build with an index gets it as an --extra-index-url line, and its name as the local version of the torch and
    torchvision pins (torch==2.14.1 -> torch==2.14.1+cu126: those exist on that index alone, PyPI refuses local
    versions); a build without one (cu130: torch 2.14's PyPI wheels are CUDA 13.0 builds) keeps them. A build's
    torchcodec pin replaces the file's (torchcodec's wheels are built for one CUDA each). A pin that already names
    another build is refused: the build is chosen in one place.
    """
    if build not in builds:
        return {"ok": False, "message": (
            f"vidcluster_torch_build {build!r} is not one of python_env_torch_builds ({', '.join(builds)})")}
    spec = builds[build]
    index = str(spec.get("index") or "")
    torchcodec = str(spec.get("torchcodec") or "")
    lines = []
    for line in requirements.splitlines():
        pin, codec = _PIN.match(line), _TORCHCODEC_PIN.match(line)
        if pin and index:
            if pin[3] and pin[3] != f"+{build}":
                return {"ok": False, "message": (
                    f"the requirements pin {line.strip()}, another build than vidcluster_torch_build {build}: pin "
                    f"{pin[1]}=={pin[2]} (the build adds +{build})")}
            line = f"{pin[1]}=={pin[2]}+{build}{pin[4]}"
        elif codec and torchcodec:
            line = f"torchcodec=={torchcodec}{codec[1]}"
        lines.append(line)
    header = [f"# torch build {build} (vidcluster_torch_build)", f"--extra-index-url {index}"] if index else []
    return {"ok": True, "message": "", "text": "\n".join(header + lines) + "\n", "cuda": str(spec.get("cuda") or ""),
            "index": index}


def _arch(arch: str) -> tuple[str, tuple[int, int], str]:
    """'sm_86' -> ('sm', (8, 6), ''); 'sm_90a' -> ('sm', (9, 0), 'a'); 'compute_120' -> ('compute', (12, 0), '')."""
    kind, _, code = arch.partition("_")
    digits = code.rstrip("af")
    return kind, (int(digits[:-1]), int(digits[-1])), code[len(digits):]


def runs_on(capability: Sequence[int], archs: Sequence[str]) -> bool:
    """Whether a build with kernels for ``archs`` (torch.cuda.get_arch_list()) runs on a GPU of ``capability``.

    A cubin sm_XY runs on compute capability X.Z for Z >= Y (binary compatibility within a major version, never
    across); sm_XYa on X.Y alone, sm_XYf on X.Z, Z >= Y; PTX compute_XY is compiled for any capability >= X.Y.
    """
    cap = (int(capability[0]), int(capability[1]))
    for kind, (major, minor), suffix in map(_arch, archs):
        if kind == "compute" and cap >= (major, minor):
            return True
        if kind == "sm" and cap[0] == major and (cap[1] == minor if suffix == "a" else cap[1] >= minor):
            return True
    return False


def _span(archs: Sequence[str]) -> str:
    cubins = sorted((a for a in archs if a.startswith("sm_")), key=lambda a: _arch(a)[1])
    ptx = [a for a in archs if a.startswith("compute_")]
    span = f"{cubins[0]}..{cubins[-1]}" if len(cubins) > 2 else " ".join(cubins) or "no GPU"
    return span + (f" (PTX {' '.join(ptx)})" if ptx else "")


def gpu_fit(report: Mapping[str, Any], node: str, builds: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Each GPU's compute capability beside the kernels of the node's torch (env_report.py's gpu_checks and
    torch_archs): ``{record, problems}``. A GPU the build has no kernels for is a problem naming the builds that have
    them; so is one whose small CUDA operation failed."""
    archs = report.get("torch_archs") or []
    gpus, problems = [], []
    for gpu in report.get("gpu_checks") or []:
        cap = tuple(int(part) for part in str(gpu["capability"]).split("."))
        where = f"{node} GPU {gpu['index']} {gpu['name']} sm_{cap[0]}{cap[1]}"
        gpus.append(where.removeprefix(f"{node} "))
        if not runs_on(cap, archs):
            fits = [name for name, spec in builds.items() if runs_on(cap, spec.get("archs") or [])]
            advice = (f"choose {' or '.join(fits)} (vidcluster_torch_build)" if fits
                      else "no build in python_env_torch_builds has kernels for it")
            problems.append(f"{where}: torch {report.get('torch')} has kernels for {_span(archs)}; {advice}")
        elif gpu["op"] != "ok":
            problems.append(f"{where}: a small CUDA operation failed with torch {report.get('torch')}: {gpu['op']}")
    record = f"{node}: {', '.join(gpus)}; torch {report.get('torch')} has kernels for {_span(archs)}" if gpus else ""
    return {"record": record, "problems": problems}


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
            verdict = driver_verdict(driver, cuda, driver_table)
            if not verdict["ok"]:
                problems.append(f"{node}: {verdict['message']}")
        problems += [f"{node}: {problem}" for problem in decoder_problems(report, decoders)]
    return problems


class FilterModule:
    """Registers the filters as python_env_<name>."""

    def filters(self) -> dict[str, Callable[..., Any]]:
        return {
            "python_env_builds_for_driver": builds_for_driver,
            "python_env_decoder_problems": decoder_problems,
            "python_env_driver_verdict": driver_verdict,
            "python_env_gpu_fit": gpu_fit,
            "python_env_slurm_problems": slurm_problems,
            "python_env_slurm_reports": slurm_reports,
            "python_env_torch_requirements": torch_requirements,
            "python_env_version_table": version_table,
        }
