"""A pytest plugin for scripts/gpu-check.sh: each test's outcome written the moment it is known, so a stage that runs
out of time keeps every result it got (JUnit XML is written only when pytest ends).

    python -m pytest -p tests.trainer._gpu_results --gpu-results FILE tests/trainer/test_gpu.py

FILE gets one JSON object per line, flushed and synced: ``{"collected": [test ids]}`` once, ``{"started": id}`` as a
test starts, ``{"ended": id, "outcome": "passed"|"failed"|"skipped", "seconds", "message", "figures"}`` as it ends
(``figures``: what the test recorded with record_property). bench/gpu_check.py reads it: a test that started and
never ended was running when the time ran out; one that never started was not reached.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

OPTION = "--gpu-results"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(OPTION, metavar="FILE", help="write each GPU test's outcome to FILE as it ends (JSON lines)")


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption(OPTION)
    if path:
        config.pluginmanager.register(Recorder(path), "vidcluster-gpu-results")


def _message(report: pytest.TestReport) -> str:
    """A skip's reason, or the first line of what failed."""
    if report.skipped and isinstance(report.longrepr, tuple):
        text = str(report.longrepr[2]).removeprefix("Skipped: ")
    else:
        crash = getattr(report.longrepr, "reprcrash", None)
        text = crash.message if crash is not None else str(report.longrepr or "")
    return text.splitlines()[0][:400] if text else ""


class Recorder:
    def __init__(self, path: str) -> None:
        self.path = path

    def write(self, event: dict[str, Any]) -> None:
        with open(self.path, "a", encoding="utf-8") as out:
            out.write(json.dumps(event) + "\n")
            out.flush()
            os.fsync(out.fileno())

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.write({"collected": [item.nodeid for item in session.items]})

    def pytest_runtest_logstart(self, nodeid: str) -> None:
        self.write({"started": nodeid})

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        # One end per test: its call, or the setup that skipped or failed it, or a teardown that failed after it.
        if report.when == "call" or (report.when == "setup" and not report.passed) or (
                report.when == "teardown" and report.failed):
            self.write({"ended": report.nodeid, "outcome": report.outcome, "seconds": round(report.duration, 1),
                        "message": _message(report), "figures": dict(report.user_properties).get("figures", "")})
