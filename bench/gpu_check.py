"""The GPU check's one account: this machine, then one table of what held, what was measured and what was not checked.

scripts/gpu-check.sh runs tests/trainer/test_gpu.py (each test's outcome written as it ends, by the pytest plugin
tests/trainer/_gpu_results.py: OUT/tests.jsonl) and bench/gpu_step.py (OUT/gpu_step.json, rewritten after each
setting), each under a time limit, then

    python -m bench.gpu_check OUT [--stage NAME=EXIT_STATUS ...]

prints the machine's facts (GPUs, driver, torch, CUDA, cuDNN, NCCL, the kernels the torch build has, the decoders'
builds, what torch.compile needs) and the table, and writes both to OUT/gpu-check.md. Every GPU test and every bench
setting is a row: passed (with its figures), failed, running when its stage's time ran out, or not checked with the
reason (a skip, a stage that ended before reaching it, no GPU). It imports torch and nothing of the decoders (their
versions come from the installed packages' metadata), so a decoder that does not import cannot cost the table.

Exit status: 0 when nothing failed, 1 when something failed or ran out of time, 3 when no GPU is visible (every row
is then "not checked").
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

from trainer.hardware import compile_problem, cuda_build, torchcodec_version

TIMED_OUT = 124  # timeout(1)'s exit status
NO_GPU_EXIT = 3
NOT_CHECKED = "not checked"
Row = tuple[str, str, str]  # check, result, detail
TESTS_FILE = "tests.jsonl"
BENCH_FILE = "gpu_step.json"


def driver_version() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown (nvidia-smi did not answer)"
    return out.splitlines()[0].strip() if out.strip() else "unknown"


def installed(name: str) -> str:
    try:
        version = torchcodec_version() if name == "torchcodec" else metadata.version(name)
    except metadata.PackageNotFoundError:
        version = ""
    if not version:
        return f"{name} not installed"
    return f"{name} {version}" + (" (CUDA build)" if cuda_build(version) else "")


def machine(gpus: list[Any]) -> list[str]:
    """The machine as this Python sees it, one fact per line. ``gpus``: torch's device properties."""
    import torch

    if gpus:
        names = ", ".join(f"{p.name} (sm_{p.major}{p.minor}, {p.total_memory / 2**30:.0f} GiB)" for p in gpus)
        lines = [f"GPUs: {len(gpus)}: {names}; driver {driver_version()}"]
    else:
        lines = ["GPUs: none visible to torch (no driver, no CUDA build, or CUDA_VISIBLE_DEVICES hides them)"]
    nccl = ".".join(map(str, torch.cuda.nccl.version())) if gpus else "-"
    cudnn = torch.backends.cudnn.version() or 0  # 92400 is 9.24.0
    archs = torch.cuda.get_arch_list() if torch.version.cuda else []
    lines.append(f"torch {torch.__version__}: CUDA {torch.version.cuda}, cuDNN {cudnn // 10000}.{cudnn % 10000 // 100}"
                 f".{cudnn % 100}, NCCL {nccl}, kernels for {' '.join(archs) or 'no GPU'}; "
                 f"Python {platform.python_version()}")
    lines.append("; ".join(installed(name) for name in ("torchvision", "decord", "torchcodec")))
    lines.append(f"torch.compile: {compile_problem('cuda') or 'a C compiler and Python.h are here'}")
    return lines


def _events(path: Path) -> Iterator[dict[str, Any]]:
    for line in path.read_text().splitlines():
        try:
            yield json.loads(line)
        except ValueError:
            continue  # the last line of a stage killed while writing it


def gpu_test_rows(path: Path) -> list[Row]:
    """A row per collected GPU test, from the outcomes written as each ended (tests/trainer/_gpu_results.py)."""
    collected: list[str] = []
    started: set[str] = set()
    ended: dict[str, dict[str, Any]] = {}
    for event in _events(path):
        collected += event.get("collected", [])
        started.update([event["started"]] if "started" in event else [])
        ended.update({event["ended"]: event} if "ended" in event else {})
    rows = []
    for test in collected:
        name = test.split("::", 1)[-1].removeprefix("test_").replace("_", " ")
        end = ended.get(test)
        if end is None:
            rows.append((name, "**TIMED OUT**", "was running when the stage's time ran out") if test in started
                        else (name, NOT_CHECKED, "the stage ended before it started"))
        elif end["outcome"] == "skipped":
            rows.append((name, NOT_CHECKED, end["message"]))
        elif end["outcome"] == "failed":
            rows.append((name, "**FAILED**", end["message"]))
        else:
            rows.append((name, "passed", f"{end['seconds']:.0f} s" + (f"; {end['figures']}" if end["figures"] else "")))
    return rows


def describe(m: dict[str, Any], base: dict[str, Any]) -> tuple[str, str]:
    """(result, detail) of one bench/gpu_step.py setting, its speed-up over ``base``: as every table shows it."""
    if "skipped" in m:
        return NOT_CHECKED, m["skipped"]
    speedup = f" ({base['step_s'] / m['step_s']:.2f}x)" if "step_s" in base else ""
    return (f"step {1000 * m['step_s']:.1f} ms{speedup}",
            f"data wait {100 * m['data_wait']:.1f}%, peak {m['peak_gib']:.1f} GiB")


def bench_rows(path: Path) -> list[Row]:
    """A row per bench/gpu_step.py setting: measured, skipped with the reason, or not reached."""
    result = json.loads(path.read_text())
    rows = result["rows"]
    measured = [(f"{result['model']} step: {row['setting']}", *describe(row, rows[0])) for row in rows]
    why = result.get("skipped", "not measured: the bench ended first")
    return measured + [(f"{result['model']} step: {name}", NOT_CHECKED, why) for name in result["settings"][len(rows):]]


def stage_rows(out: Path, stages: dict[str, int]) -> list[Row]:
    """The GPU tests and the bench: their rows, and a row for a stage that timed out or ended abnormally."""
    rows: list[Row] = []
    for stage, (file, read) in {"tests": (TESTS_FILE, gpu_test_rows), "bench": (BENCH_FILE, bench_rows)}.items():
        status = stages.get(stage)
        if status == TIMED_OUT:
            rows.append((f"{stage} stage", "**TIMED OUT**", f"its time limit ran out; the log is {out}/{stage}.log"))
        elif status not in (None, 0) and not (stage == "tests" and status == 1):  # pytest: 1 = some test failed
            rows.append((f"{stage} stage", f"**exit status {status}**", f"see {out}/{stage}.log"))
        if (out / file).is_file():
            rows += read(out / file)
        else:
            rows.append((f"{stage} stage", NOT_CHECKED, f"no results ({out / file} was not written)"))
    return rows


def account(facts: list[str], rows: list[Row]) -> str:
    lines = [f"- {fact}" for fact in facts] + ["", "| check | result | detail |", "|---|---|---|"]
    lines += [f"| {check} | {result} | {detail.replace('|', '/')} |" for check, result, detail in rows]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu_check", description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the folder the GPU check wrote its results to")
    parser.add_argument("--stage", action="append", default=[], metavar="NAME=STATUS",
                        help="a stage's exit status (tests, bench), as scripts/gpu-check.sh saw it")
    args = parser.parse_args(argv)
    stages = {name: int(status) for name, status in (item.split("=", 1) for item in args.stage)}
    import torch

    gpus = [torch.cuda.get_device_properties(i) for i in range(torch.cuda.device_count())] \
        if torch.cuda.is_available() else []
    rows = stage_rows(args.out, stages)
    text = account(machine(gpus), rows)
    (args.out / "gpu-check.md").write_text(text)
    print(text, end="")
    if not gpus:
        print("gpu-check: no GPU is visible here, so nothing was checked", file=sys.stderr)
        return NO_GPU_EXIT
    return 1 if any(result.startswith("**") for _, result, _ in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
