"""The GPU check where there is no GPU (scripts/gpu-check.sh, scripts/gpu-bundle.sh, bench/gpu_check.py): the
bundle's requirements resolve with pip for the bare image's Python 3.12 without pulling torch in; the check exits
non-zero within two minutes saying there is no GPU, with its table written and every row "not checked"; every stage
runs under its budget and the budgets add up to at most 9 minutes (read from the script); a stage cut short by its
time limit keeps every outcome it got (a real pytest run killed by timeout(1))."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from bench.gpu_check import NO_GPU_EXIT, NOT_CHECKED, bench_rows, gpu_test_rows

REPO = Path(__file__).resolve().parents[1]
GPU_CHECK = REPO / "scripts" / "gpu-check.sh"
DEVICE_WINDOW_S = 9 * 60
MANYLINUX = ("manylinux_2_28", "manylinux_2_27", "manylinux_2_17", "manylinux2014", "manylinux2010", "manylinux1")


def table_rows(text: str) -> list[list[str]]:
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in text.splitlines()
            if line.startswith("| ") and not line.startswith("| check ")]


def test_bundle_requirements_resolve_for_python_312_without_torch(tmp_path: Path) -> None:
    requirements = tmp_path / "bundle.txt"
    subprocess.run(["bash", str(REPO / "scripts" / "gpu-bundle.sh"), "--requirements", str(requirements)], check=True)
    pins = requirements.read_text().splitlines()
    assert "torchcodec==0.11.1" in pins and not any(line.startswith(("torch=", "torchvision", "-")) for line in pins)
    platforms = [arg for tag in MANYLINUX for arg in ("--platform", f"{tag}_x86_64")]
    subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
                    "--disable-pip-version-check", "--target", str(tmp_path / "target"), "--only-binary=:all:",
                    "--python-version", "3.12", "--implementation", "cp", "--abi", "cp312", *platforms,
                    "-r", str(requirements), "--report", str(tmp_path / "report.json")],
                   check=True, capture_output=True, text=True, timeout=300)  # fmt: skip
    resolved = {item["metadata"]["name"].lower(): item["metadata"]["version"]
                for item in json.loads((tmp_path / "report.json").read_text())["install"]}
    assert resolved["torchcodec"] == "0.11.1" and "decord" in resolved and "pytest" in resolved
    assert not [name for name in resolved if name in ("torch", "torchvision", "triton") or name.startswith("nvidia")]


def test_check_without_a_gpu_exits_non_zero_with_every_row_not_checked(tmp_path: Path) -> None:
    started = time.monotonic()
    proc = subprocess.run(["bash", str(REPO / "scripts" / "gpu-check.sh"), str(tmp_path / "out")], cwd=REPO,
                          capture_output=True, text=True, timeout=300, check=False)
    took = time.monotonic() - started
    assert proc.returncode == NO_GPU_EXIT, proc.stdout + proc.stderr
    assert took < 120, f"the GPU check took {took:.0f} s on a machine without a GPU"
    assert "no GPU is visible here" in proc.stdout and "nothing was checked" in proc.stderr
    logs = proc.stdout + proc.stderr + "".join(p.read_text() for p in (tmp_path / "out").glob("*.log"))
    assert "Traceback" not in logs
    table = (tmp_path / "out" / "gpu-check.md").read_text()
    rows = table_rows(table)
    assert len(rows) == 17, table  # the 14 GPU tests (node, tests and in-place stages) and the bench's 3 settings
    assert [row for row in rows if row[1] != NOT_CHECKED] == [], table
    assert "- GPUs: none visible to torch" in table and "torch.compile: " in table


def stage_budgets(script: str) -> tuple[dict[str, int], int, list[str]]:
    """gpu-check.sh's budgets (BUDGET_S), its KILL_AFTER_S, and the stages it runs in order (``staged NAME`` and
    ``gpu_tests NAME`` calls, the functions' own lines left out)."""
    budgets = {name: int(seconds) for name, seconds in
               re.findall(r"\[(\w+)\]=(\d+)", re.search(r"^declare -A BUDGET_S=\((.*)\)$", script, re.M).group(1))}
    kill_after = int(re.search(r"^KILL_AFTER_S=(\d+)$", script, re.M).group(1))
    runs = re.findall(r"^\s*(?:\w+=\$\()?(?:staged|gpu_tests) (\w+) ", script, re.M)
    return budgets, kill_after, runs


def test_every_stage_runs_under_its_budget_and_all_fit_the_device_window() -> None:
    script = GPU_CHECK.read_text()
    budgets, kill_after, runs = stage_budgets(script)
    assert runs == ["python", "install", "gpus", "node", "tests", "inplace", "bench", "table"]
    assert sorted(runs) == sorted(budgets)  # every stage has a budget, each budget is one stage's
    worst = sum(budgets[name] + kill_after for name in runs)
    assert worst <= DEVICE_WINDOW_S, f"the stages may take {worst} s, more than {DEVICE_WINDOW_S} s"
    in_stage = re.compile(r'\bstaged (\w+|"\$name") ')
    untimed = [line for line in script.splitlines() if '"$PYTHON"' in line and not in_stage.search(line)]
    assert untimed == [], untimed  # every Python the script starts is inside a stage
    assert 'timeout --kill-after="$KILL_AFTER_S" "${BUDGET_S[$name]}"' in script
    # The stages' test ids are test_gpu.py's.
    names = set(re.findall(r"::(test_\w+)", script))
    defined = re.findall(r"^def (test_\w+)", (REPO / "tests" / "trainer" / "test_gpu.py").read_text(), re.M)
    assert names and names <= set(defined), names - set(defined)


def test_a_stage_cut_short_keeps_every_outcome_it_got(tmp_path: Path) -> None:
    (tmp_path / "test_stage.py").write_text(textwrap.dedent("""
        import time, pytest

        def test_holds(record_property):
            record_property("figures", '{"error": 0.001}')

        def test_breaks():
            assert 1 == 2, "one is not two"

        def test_needs_two_gpus():
            pytest.skip("needs 2 GPUs, 1 visible")

        def test_hangs():
            time.sleep(600)

        def test_never_reached():
            pass
    """))
    results = tmp_path / "tests.jsonl"
    # 6 s: pytest reaches test_hangs within a second; the rest of the limit is test_hangs waiting to be killed.
    proc = subprocess.run(["timeout", "6", sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "0",
                           "-p", "no:randomly", "-o", "addopts=", "--timeout=0", "-p", "tests.trainer._gpu_results",
                           "--gpu-results", str(results), "--rootdir", str(tmp_path), str(tmp_path / "test_stage.py")],
                          cwd=REPO, capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert proc.returncode == 124, proc.stdout[-2000:]  # killed by its time limit, as gpu-check.sh's stages are
    assert gpu_test_rows(results) == [
        ("holds", "passed", '0 s; {"error": 0.001}'),
        ("breaks", "**FAILED**", "AssertionError: one is not two"),
        ("needs two gpus", NOT_CHECKED, "needs 2 GPUs, 1 visible"),
        ("hangs", "**TIMED OUT**", "was running when the stage's time ran out"),
        ("never reached", NOT_CHECKED, "the stage ended before it started"),
    ]


def test_a_bench_cut_short_lists_the_settings_it_did_not_reach(tmp_path: Path) -> None:
    partial = {"model": "m", "settings": ["plain", "levers", "compiled"],
               "rows": [{"setting": "plain", "step_s": 0.2, "data_wait": 0.1, "peak_gib": 3.0},
                        {"setting": "levers", "skipped": "compile: not measured, no compiler"}]}
    (tmp_path / "gpu_step.json").write_text(json.dumps(partial))
    assert bench_rows(tmp_path / "gpu_step.json") == [
        ("m step: plain", "step 200.0 ms (1.00x)", "data wait 10.0%, peak 3.0 GiB"),
        ("m step: levers", NOT_CHECKED, "compile: not measured, no compiler"),
        ("m step: compiled", NOT_CHECKED, "not measured: the bench ended first"),
    ]
