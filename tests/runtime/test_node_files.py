"""What a node keeps of a job, and what runs there: the watch's key is created 0600 (never in another mode, whatever
the umask); a code version's whole folder is checked before it is reused (a planted sitecustomize.py makes it differ,
a folder others may write is refused); the runtime's verbs run the job's code version, never a stray ~/trainer/."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cluster.conftest import REPO
from tests.runtime.test_plan import job, plans
from trainer.runtime import codeship, layout
from trainer.runtime.host import nodestate


def runtime(*argv: str, stdin: bytes = b"", cwd: Path = REPO) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-P", "-m", "trainer.runtime", *argv], input=stdin, cwd=cwd,
                          capture_output=True, env={**os.environ, "PYTHONPATH": str(REPO)})


def test_the_watchs_key_is_created_0600_whatever_the_umask(tmp_path: Path) -> None:
    folder = tmp_path / "job"
    folder.mkdir()
    (folder / layout.SECRET_FILE).write_text("the last launch's key\n")
    (folder / layout.SECRET_FILE).chmod(0o644)
    old = os.umask(0)  # a file created with the default mode would be 0666
    try:
        done = runtime("keep-secret", str(folder), stdin=b"0123456789abcdef0123456789abcdef\n")
    finally:
        os.umask(old)
    assert done.returncode == 0 and json.loads(done.stdout) == {"changed": True}, done.stderr
    secret = folder / layout.SECRET_FILE
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600 and secret.read_text() == "0123456789abcdef0123456789abcdef\n"
    assert [p.name for p in folder.iterdir()] == [layout.SECRET_FILE]  # nothing left beside it
    short = runtime("keep-secret", str(folder), stdin=b"short\n")
    assert short.returncode != 0 and short.stderr.decode() == "error: the job's secret is too short\n"


def shipped(tmp_path: Path) -> tuple[str, list[str]]:
    """This trainer's code, archived as the controller does and installed as a node does: (its folder, the
    controller's manifest)."""
    made = codeship.archive(str(REPO / "trainer"), str(tmp_path / "code.tar.gz"))
    code_dir = str(tmp_path / "code" / made["version"])
    codeship.install(str(tmp_path / "code.tar.gz"), code_dir)
    return code_dir, made["manifest"]


def test_a_code_folder_is_reused_only_when_it_holds_exactly_the_version(tmp_path: Path) -> None:
    code_dir, manifest = shipped(tmp_path)
    assert codeship.verify(code_dir)["manifest"] == manifest
    (Path(code_dir) / "trainer" / "__pycache__").mkdir(exist_ok=True)
    (Path(code_dir) / "trainer" / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"a cache")
    assert codeship.verify(code_dir)["manifest"] == manifest  # Python's own caches are not the version
    planted = Path(code_dir) / "sitecustomize.py"  # PYTHONPATH is the folder: every job process would run it
    planted.write_text("open('/tmp/ran', 'w')\n")
    (Path(code_dir) / "trainer" / "stray.pyc").write_bytes(b"importable")
    found = codeship.verify(code_dir)["manifest"]
    assert sorted(set(found) - set(manifest)) == sorted(
        f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.relative_to(code_dir)}"
        for p in (planted, Path(code_dir) / "trainer" / "stray.pyc"))
    codeship.archive(str(REPO / "trainer"), str(tmp_path / "again.tar.gz"))
    codeship.install(str(tmp_path / "again.tar.gz"), code_dir)  # the launcher ships it again: the folder is replaced
    assert codeship.verify(code_dir)["manifest"] == manifest and not planted.exists()


@pytest.mark.parametrize("where", ["code root", "version", "package", "cache"])
def test_a_code_folder_others_may_write_is_refused_naming_it(tmp_path: Path, where: str) -> None:
    code_dir, _ = shipped(tmp_path)
    cache = Path(code_dir) / "trainer" / "__pycache__"
    cache.mkdir(exist_ok=True)
    target = {"code root": Path(code_dir).parent, "version": Path(code_dir), "package": Path(code_dir) / "trainer",
              "cache": cache}[where]
    target.chmod(target.stat().st_mode | stat.S_IWGRP)
    done = subprocess.run([sys.executable, "-I", "-c", (REPO / "trainer/runtime/codeship.py").read_text(), "verify",
                           code_dir], capture_output=True, text=True)
    assert done.returncode == 2 and done.stdout == "", done
    assert done.stderr.startswith(f"error: {target} (mode ") and "writable by others than its owner" in done.stderr
    assert done.stderr.count("\n") == 1


def test_the_runtime_runs_the_jobs_code_version_never_a_stray_trainer_in_the_login_folder(tmp_path: Path) -> None:
    """The launcher runs the entry point (layout.py) in the SSH login's folder, the node user's home, with -I; the
    entry point runs the job's runtime with -P (a ~/trainer/ there, an old checkout, is never imported) and -S (a
    sitecustomize.py planted in the code version's folder, its PYTHONPATH, does not run before the launcher checked
    that folder)."""
    home = tmp_path / "home"
    stray = home / "trainer" / "runtime"
    stray.mkdir(parents=True)
    for package in (home / "trainer", stray):
        (package / "__init__.py").write_text(f"open({str(home / 'stray-ran')!r}, 'w').write({str(package)!r})\n")
    (stray / "__main__.py").write_text("raise SystemExit(3)\n")
    (home / "json.py").write_text(f"open({str(home / 'stray-ran')!r}, 'w').write('json')\n")
    code = tmp_path / "code" / "v1"
    code.mkdir(parents=True)
    (code / "trainer").symlink_to(REPO / "trainer")
    (code / "sitecustomize.py").write_text(f"open({str(home / 'stray-ran')!r}, 'w').write('sitecustomize')\n")
    planned = plans(job([str(home)], net="127.0.0"))["n0"]
    paths = dataclasses.replace(planned.paths, env_python=sys.executable, code_dir=str(code))
    plan = dataclasses.replace(planned, paths=paths, argv=(sys.executable, "-P", "-c", "pass"))
    folder = Path(plan.paths.job_dir)
    folder.mkdir(parents=True)
    (folder / layout.PLAN_FILE).write_text(plan.to_json())
    (folder / layout.SECRET_FILE).write_text("a-test-secret-of-this-job\n")
    entry = [sys.executable, "-I", "-c", (REPO / "trainer/runtime/layout.py").read_text()]
    args = ["--jobs-dir", "~/vidcluster/jobs", "--job", plan.job, "--node", "n0"]
    env = {**os.environ, "HOME": str(home)}
    env.pop("PYTHONPATH", None)
    started = subprocess.run([*entry, "start", *args], cwd=home, env=env, capture_output=True, text=True)
    assert started.returncode == 0, started.stderr
    assert json.loads(started.stdout)["state"] in ("running", "ended")  # its one-node job of "pass" may be over
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        status = subprocess.run([*entry, "status", *args], cwd=home, env=env, capture_output=True, text=True)
        if json.loads(status.stdout)["state"] != "running":
            break
        time.sleep(0.2)
    assert json.loads(status.stdout)["state"] == "finished", status.stdout
    assert not (home / "stray-ran").exists()


def test_a_stop_request_is_read_as_a_typed_value_for_its_supervisor_only(tmp_path: Path) -> None:
    nodestate.request_stop(str(tmp_path), 4242, "user", "enough epochs")
    request = nodestate.stop_request(str(tmp_path), 4242)
    assert request is not None and (request.by, request.reason) == ("user", "enough epochs")
    assert abs(request.at - time.time()) < 60 and nodestate.stop_request(str(tmp_path), 4343) is None
    (tmp_path / layout.STOP_REQUEST_FILE).write_text(json.dumps({"pid": 4242, "by": "user"}))  # another version's
    assert nodestate.stop_request(str(tmp_path), 4242) is None
