"""Lint gates for the whole repository: ansible-lint (production profile), yamllint (strict) and ruff."""

from __future__ import annotations

import os
import subprocess

from tests.cluster.conftest import REPO, VENV_BIN


def run_tool(*cmd: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{VENV_BIN}:{os.environ.get('PATH', '')}", "NO_COLOR": "1",
           "ANSIBLE_NOCOLOR": "1"}
    return subprocess.run([str(VENV_BIN / cmd[0]), *cmd[1:]], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600, check=False)


def test_ansible_lint_production_profile() -> None:
    root_playbooks = sorted(p.name for p in REPO.glob("*.yml"))  # setup-cluster.yml, launch-training.yml
    proc = run_tool("ansible-lint", "--profile", "production", "roles/", "playbooks/", *root_playbooks)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-4000:]
    assert "Profile 'production' was required, and it passed" in proc.stdout + proc.stderr


def test_yamllint_strict() -> None:
    proc = run_tool("yamllint", "-s", ".")
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]


def test_ruff() -> None:
    proc = run_tool("ruff", "check", ".")
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
