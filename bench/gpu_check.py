"""The GPU check's one table: this machine, what held, what was measured, and what could not be checked.

scripts/gpu-check.sh runs tests/trainer/test_gpu.py (pytest's JUnit XML: tests.xml) and bench/gpu_step.py
(gpu_step.json) into OUT, each under a time limit, then

    python -m bench.gpu_check OUT [--stage NAME=EXIT_STATUS ...]

adds the machine's facts (GPUs, driver, torch, CUDA, cuDNN, NCCL, the decoders), prints the table and writes it to
OUT/gpu-check.md. A stage that timed out or failed before writing its file is a row of its own, and everything that
was not checked (a skipped test, the bench on a machine without CUDA) is listed with the reason, so a short device
window always ends with a complete account.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from bench.gpu_step import MODEL, SETTINGS, describe

TIMED_OUT = 124  # timeout(1)'s exit status
Row = tuple[str, str, str]  # check, result, detail


def machine() -> list[Row]:
    """GPUs, driver and the software stack as this Python sees it (imports that fail are facts too)."""
    import torch

    rows: list[Row] = []
    if torch.cuda.is_available():
        gpus = [torch.cuda.get_device_properties(i) for i in range(torch.cuda.device_count())]
        names = ", ".join(f"{p.name} (sm {p.major}.{p.minor}, {p.total_memory / 2**30:.0f} GiB)" for p in gpus)
        rows.append(("GPUs", f"{len(gpus)}", f"{names}; driver {driver_version()}"))
    else:
        rows.append(("GPUs", "0", "torch sees no CUDA GPU"))
    nccl = ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else "-"
    cudnn = torch.backends.cudnn.version() or 0  # 92400 is 9.24.0
    rows.append(("torch", torch.__version__, f"CUDA {torch.version.cuda}, cuDNN {cudnn // 10000}.{cudnn % 10000 // 100}"
                 f".{cudnn % 100}, NCCL {nccl}; Python {platform.python_version()}"))
    rows.append(("torchvision", *imported_version("torchvision")))
    rows.append(("decord", *imported_version("decord")))
    rows.append(("torchcodec", *torchcodec_facts()))
    return rows


def driver_version() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown (no nvidia-smi)"
    return out.splitlines()[0].strip() if out.strip() else "unknown"


def imported_version(module: str) -> tuple[str, str]:
    try:
        return __import__(module).__version__, ""
    except Exception as exc:  # not installed, or built for another torch
        return "does not import", f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


def torchcodec_facts() -> tuple[str, str]:
    from trainer.data.decoders import torchcodec_cuda_build, torchcodec_problem

    problem = torchcodec_problem()
    if problem is not None:
        return "cannot decode here", problem
    import torchcodec

    build = "CUDA build" if torchcodec_cuda_build() else "CPU-only build (no decoding on the GPU)"
    return torchcodec.__version__, f"{build}; FFmpeg {torchcodec.ffmpeg_major_version}"


def test_rows(xml_file: Path) -> tuple[list[Row], list[str]]:
    """(a row per GPU test, why each test that did not run was not run)."""
    rows: list[Row] = []
    not_checked: list[str] = []
    for case in ET.parse(xml_file).getroot().iter("testcase"):
        name = case.get("name", "").removeprefix("test_").replace("_", " ")
        skipped, failure = case.find("skipped"), case.find("failure")
        failure = case.find("error") if failure is None else failure
        figures = {p.get("name"): p.get("value") for p in case.iter("property")}.get("figures", "")
        if skipped is not None:
            rows.append((name, "not checked", "see below"))
            not_checked.append(f"{name}: {skipped.get('message', '')}")
        elif failure is not None:
            rows.append((name, "**FAILED**", failure.get("message", "").splitlines()[0][:300]))
        else:
            rows.append((name, "passed", f"{float(case.get('time', 0)):.0f} s; {figures}" if figures else
                         f"{float(case.get('time', 0)):.0f} s"))
    return rows, not_checked


def bench_rows(json_file: Path) -> tuple[list[Row], list[str]]:
    result = json.loads(json_file.read_text())
    if "skipped" in result:
        return [], [f"{MODEL} step times (bench/gpu_step.py): {result['skipped']}"]
    rows = result["rows"]
    measured = [(f"{MODEL} step: {row['setting']}", *describe(row, rows[0])) for row in rows]
    unmeasured = [f"{MODEL} step: {name}: not measured (the bench ended first)" for name, _, _ in SETTINGS[len(rows):]]
    return measured, unmeasured


def stage_rows(out: Path, stages: dict[str, int]) -> tuple[list[Row], list[str]]:
    """The GPU tests and the bench: their rows, or why there are none."""
    rows: list[Row] = []
    not_checked: list[str] = []
    for stage, (file, read) in {"tests": ("tests.xml", test_rows), "bench": ("gpu_step.json", bench_rows)}.items():
        status = stages.get(stage)
        if status == TIMED_OUT:
            rows.append((f"{stage} stage", "**TIMED OUT**", f"its time limit ran out; the log is in {out}/{stage}.log"))
        elif status not in (None, 0) and not (stage == "tests" and status == 1):  # pytest: 1 = some test failed
            rows.append((f"{stage} stage", f"**exit status {status}**", f"see {out}/{stage}.log"))
        if (out / file).is_file():
            found, missing = read(out / file)
            rows += found
            not_checked += missing
        else:
            not_checked.append(f"{stage}: no results ({out / file} was not written)")
    return rows, not_checked


def table(rows: list[Row], not_checked: list[str]) -> str:
    lines = ["| check | result | detail |", "|---|---|---|"]
    lines += [f"| {check} | {result} | {detail.replace('|', '/')} |" for check, result, detail in rows]
    lines += ["", "Not checked here:" if not_checked else "Everything was checked."]
    lines += [f"- {reason}" for reason in not_checked]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu_check", description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the folder the GPU check wrote its results to")
    parser.add_argument("--stage", action="append", default=[], metavar="NAME=STATUS",
                        help="a stage's exit status (tests, bench), as scripts/gpu-check.sh saw it")
    args = parser.parse_args(argv)
    stages = {name: int(status) for name, status in (item.split("=", 1) for item in args.stage)}
    found, not_checked = stage_rows(args.out, stages)
    text = table(machine() + found, not_checked)
    (args.out / "gpu-check.md").write_text(text)
    print(text, end="")
    failed = any(result.startswith("**") for _, result, _ in found)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
