"""Say whether this Python environment already satisfies a requirements file, without running pip.

Usage: <env>/bin/python check_requirements.py REQUIREMENTS   ("-": read them from stdin)
Prints {"satisfied": bool, "unsatisfied": ["torch==2.14.1 (installed 2.13.0+cpu)", ...]}. python_env calls pip
only when something is unsatisfied: pip is idempotent too, but resolving a 5 GB CUDA stack takes it minutes.
Only the listed (pinned) packages are checked; a line this script cannot judge (-r, -e, URLs) counts as
unsatisfied so that pip decides; index options (--extra-index-url ...) are skipped.
"""

from __future__ import annotations

import json
import sys
from importlib import metadata

try:
    from packaging.requirements import InvalidRequirement, Requirement
except ImportError:  # every venv has pip, which vendors packaging
    from pip._vendor.packaging.requirements import InvalidRequirement, Requirement

# Options that pull in packages this script cannot see (nested files, editable checkouts, constraints).
NESTED_OPTIONS = ("-r", "--requirement", "-e", "--editable", "-c", "--constraint")


def unsatisfied(lines: list[str]) -> list[str]:
    """The requirement lines the installed distributions do not satisfy, each with what is installed."""
    problems = []
    for raw in lines:
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("-") and not line.startswith(NESTED_OPTIONS):
            continue  # index and format options add no package of their own
        try:
            req = Requirement(line)
        except InvalidRequirement:
            problems.append(f"{line} (not checked here)")
            continue
        if req.marker is not None and not req.marker.evaluate():
            continue
        if req.url:
            problems.append(f"{line} (not checked here)")
            continue
        try:
            installed = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            problems.append(f"{line} (not installed)")
            continue
        if not req.specifier.contains(installed, prereleases=True):
            problems.append(f"{line} (installed {installed})")
    return problems


def main() -> None:
    if sys.argv[1] == "-":
        text = sys.stdin.read()
    else:
        with open(sys.argv[1], encoding="utf-8") as handle:
            text = handle.read()
    problems = unsatisfied(text.splitlines())
    print(json.dumps({"satisfied": not problems, "unsatisfied": problems}))


if __name__ == "__main__":
    main()
